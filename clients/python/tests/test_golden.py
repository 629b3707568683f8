"""Conformance: the codec against crates/proto/testdata/golden.txt, in both directions.

Every valid vector's hex decodes to exactly its decoded form, and that form encodes to
exactly the hex; every invalid vector is refused with the named error kind. The test
walks the file, so a vector added there is covered here with no new code.
"""

from __future__ import annotations

import unittest

from golden_form import GOLDEN, TYPE_NAMES, describe, parse, vectors

from hongbao_client import frame as codec
from hongbao_client import messages as m


class GoldenVectors(unittest.TestCase):
    def test_the_file_is_there_and_full(self) -> None:
        self.assertTrue(GOLDEN.is_file(), f"{GOLDEN} is missing")
        all_vectors = vectors()
        self.assertGreater(sum(v.name != "invalid" for v in all_vectors), 40)
        self.assertGreater(sum(v.name == "invalid" for v in all_vectors), 20)

    def test_every_message_type_has_a_vector(self) -> None:
        self.assertEqual(set(TYPE_NAMES), set(m.BY_KIND.values()))
        covered = {v.expected.split(" ", 1)[0].removeprefix("type=") for v in vectors() if v.name != "invalid"}
        self.assertEqual(covered, set(TYPE_NAMES.values()))

    def test_valid_vectors_decode_and_encode_exactly(self) -> None:
        for v in vectors():
            if v.name == "invalid":
                continue
            with self.subTest(line=v.line_no, name=v.name):
                self.assertEqual(codec.check(v.data), len(v.data))
                decoded = codec.decode(v.data)
                self.assertEqual(describe(decoded), v.expected)
                self.assertEqual(parse(v.expected), decoded)
                self.assertEqual(codec.encode(parse(v.expected)).hex(), v.data.hex())

    def test_valid_vectors_split_at_every_offset(self) -> None:
        # A reader sees frames arrive in pieces: no prefix of a frame is a frame.
        for v in vectors():
            if v.name == "invalid" or len(v.data) > 200:
                continue
            with self.subTest(line=v.line_no, name=v.name):
                for cut in range(len(v.data)):
                    self.assertIsNone(codec.check(v.data[:cut]))

    def test_invalid_vectors_are_refused_with_their_kind(self) -> None:
        for v in vectors():
            if v.name != "invalid":
                continue
            with self.subTest(line=v.line_no, kind=v.expected):
                with self.assertRaises(codec.FrameError) as caught:
                    size = codec.check(v.data)
                    # Recoverable errors are found in a whole, well-delimited frame.
                    self.assertEqual(size, len(v.data))
                    codec.decode(v.data)
                self.assertEqual(caught.exception.kind.value, v.expected)
                fatal = v.expected in ("too-long", "too-short", "bad-version")
                self.assertEqual(caught.exception.fatal, fatal)
                if not fatal:
                    self.assertEqual(caught.exception.request_id, int.from_bytes(v.data[6:10], "big"))


class TextClamp(unittest.TestCase):
    def test_long_text_is_cut_at_a_character_boundary(self) -> None:
        from hongbao_client import messages as m

        text = "a" + "你" * 2000  # 6001 bytes; 4096 - 1 = 4095 = 3 × 1365
        frame = codec.decode(codec.encode(m.Frame(1, m.Chat(7, text))))
        assert isinstance(frame.message, m.Chat)
        self.assertEqual(frame.message.text, "a" + "你" * 1365)


if __name__ == "__main__":
    unittest.main()
