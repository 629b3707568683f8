//! Property tests standing in for `cargo fuzz`: whatever bytes arrive, `check` and
//! `decode` return instead of panicking, never allocate more than a frame could justify,
//! and whatever decodes re-encodes to the same bytes; every message round-trips.
//!
//! The allocation bound is measured with a counting global allocator that only counts
//! on the thread that asked for it, so the test harness's other threads don't disturb
//! the figures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use hongbao_proto::frame::{check, decode, encode_to_vec};
use hongbao_proto::message::{
    kind, Frame, KickReason, Message, ResultCode, MAX_FRAME_LEN, MAX_RECIPIENTS, MAX_TEXT_LEN,
    MAX_TOKEN_LEN, VERSION,
};
use proptest::prelude::*;

struct CountingAlloc;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static TOTAL: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // try_with: allocations during thread teardown must not panic.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = LARGEST.try_with(|m| m.set(m.get().max(size)));
            let _ = TOTAL.try_with(|t| t.set(t.get() + size));
        }
    });
}

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Runs `f` and returns its result with the largest single allocation and the total
/// bytes allocated on this thread meanwhile.
fn measure<R>(f: impl FnOnce() -> R) -> (R, usize, usize) {
    LARGEST.with(|m| m.set(0));
    TOTAL.with(|t| t.set(0));
    COUNTING.with(|on| on.set(true));
    let r = f();
    COUNTING.with(|on| on.set(false));
    (r, LARGEST.with(Cell::get), TOTAL.with(Cell::get))
}

/// Feeds `bytes` to the codec the way a connection would, plus a blind `decode` of the
/// whole buffer; checks nothing panics, the allocation bounds, and that what decodes
/// re-encodes to the same bytes.
fn exercise(bytes: &[u8]) {
    let (checked, largest, total) = measure(|| check(bytes));
    assert_eq!((largest, total), (0, 0), "check allocated");
    let _ = decode(bytes);
    if let Ok(Some(n)) = checked {
        let whole = &bytes[..n];
        let (decoded, largest, total) = measure(|| decode(whole));
        assert!(largest <= MAX_FRAME_LEN, "one allocation of {largest}");
        assert!(total <= 2 * MAX_FRAME_LEN, "{total} bytes allocated");
        if let Ok(frame) = decoded {
            // Decoding is strict, so the encoding is canonical: same bytes back, but for
            // the version byte (a version-1 frame reads as the current version, and this
            // side always writes the current one).
            let mut canonical = whole.to_vec();
            canonical[4] = hongbao_proto::VERSION;
            if whole[4] == 1 && frame.message.kind() == hongbao_proto::message::kind::LOGIN {
                // A version-1 login's token length is one byte, not two.
                return;
            }
            assert_eq!(encode_to_vec(&frame), canonical);
            assert_eq!(decode(&encode_to_vec(&frame)), Ok(frame));
        }
    }
}

/// Bytes that start with a plausible header: right version, mostly known types, a length
/// that usually matches the payload (so decode gets to the payload) but not always.
fn headed_bytes() -> impl Strategy<Value = Vec<u8>> {
    let kind = prop_oneof![4 => prop::sample::select(kind::ALL.to_vec()), 1 => any::<u8>()];
    let payload = prop_oneof![
        4 => prop::collection::vec(any::<u8>(), 0..64),
        1 => prop::collection::vec(any::<u8>(), 0..MAX_FRAME_LEN),
    ];
    let len_skew = prop_oneof![4 => Just(0i64), 1 => -8i64..8, 1 => -100_000i64..100_000];
    (kind, any::<u32>(), payload, len_skew).prop_map(|(kind, request_id, payload, skew)| {
        let len = (6 + payload.len() as i64 + skew).clamp(0, u32::MAX as i64) as u32;
        let mut out = len.to_be_bytes().to_vec();
        out.push(VERSION);
        out.push(kind);
        out.extend_from_slice(&request_id.to_be_bytes());
        out.extend(payload);
        out
    })
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => ".{0,40}",
        1 => Just(String::new()),
        1 => Just("红".repeat(MAX_TEXT_LEN / 3)),
    ]
}

fn result() -> impl Strategy<Value = ResultCode> {
    prop::sample::select(ResultCode::ALL.to_vec())
}

/// Every variant, with fields anywhere inside the protocol's limits.
fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (
            any::<u64>(),
            // A token is printable ASCII (a JWT's compact form).
            prop::collection::vec(0x21u8..=0x7e, 0..=MAX_TOKEN_LEN)
        )
            .prop_map(|(user_id, token)| Message::Login { user_id, token }),
        Just(Message::Shake),
        (
            any::<u64>(),
            any::<u32>(),
            prop_oneof![
                4 => prop::collection::vec(any::<u64>(), 0..8),
                1 => prop::collection::vec(any::<u64>(), 0..=MAX_RECIPIENTS),
            ],
            prop::option::of("[!-~]{1,64}"),
        )
            .prop_map(|(amount_cents, shares, recipients, idempotency_key)| {
                Message::Send {
                    amount_cents,
                    shares,
                    recipients,
                    idempotency_key,
                }
            }),
        any::<u64>().prop_map(|packet_id| Message::Open { packet_id }),
        (any::<u64>(), text()).prop_map(|(to_user, text)| Message::Chat { to_user, text }),
        any::<u64>().prop_map(|client_time_us| Message::Ping { client_time_us }),
        (result(), any::<u64>())
            .prop_map(|(result, user_id)| Message::LoginReply { result, user_id }),
        (result(), any::<u64>(), any::<u64>(), any::<u32>()).prop_map(
            |(result, packet_id, amount_cents, retry_after_ms)| Message::ShakeReply {
                result,
                packet_id,
                amount_cents,
                retry_after_ms,
            }
        ),
        (result(), any::<u64>(), any::<u64>()).prop_map(|(result, packet_id, balance_cents)| {
            Message::SendReply {
                result,
                packet_id,
                balance_cents,
            }
        }),
        (result(), any::<u64>(), any::<u64>()).prop_map(|(result, packet_id, amount_cents)| {
            Message::OpenReply {
                result,
                packet_id,
                amount_cents,
            }
        }),
        result().prop_map(|result| Message::ChatReply { result }),
        (any::<u64>(), any::<u64>()).prop_map(|(client_time_us, server_time_us)| {
            Message::Pong {
                client_time_us,
                server_time_us,
            }
        }),
        (result(), text(), any::<u32>()).prop_map(|(result, text, retry_after_ms)| {
            Message::Error {
                result,
                text,
                retry_after_ms,
            }
        }),
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<u64>()
        )
            .prop_map(
                |(packet_id, from_user, amount_cents, shares, expires_at_ms)| {
                    Message::PacketNotice {
                        packet_id,
                        from_user,
                        amount_cents,
                        shares,
                        expires_at_ms,
                    }
                }
            ),
        (any::<u64>(), text())
            .prop_map(|(from_user, text)| Message::ChatMessage { from_user, text }),
        (any::<u64>(), text()).prop_map(|(server_time_us, text)| Message::Broadcast {
            server_time_us,
            text
        }),
        (
            prop::sample::select(KickReason::ALL.to_vec()),
            text(),
            prop_oneof![Just(0u32), 1..=u32::MAX]
        )
            .prop_map(|(reason, text, retry_after_ms)| Message::Kick {
                reason,
                text,
                retry_after_ms
            }),
        any::<u64>().prop_map(|expires_at_ms| Message::Refresh { expires_at_ms }),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    (any::<u32>(), message()).prop_map(|(request_id, message)| Frame {
        request_id,
        message,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..40_000)) {
        exercise(&bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn headed_bytes_never_panic(bytes in headed_bytes()) {
        exercise(&bytes);
    }

    #[test]
    fn mutated_frames_never_panic(
        f in frame(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut bytes = encode_to_vec(&f);
        for (at, byte) in flips {
            let at = at.index(bytes.len());
            bytes[at] = byte;
        }
        exercise(&bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_message_round_trips(f in frame()) {
        let bytes = encode_to_vec(&f);
        prop_assert_eq!(check(&bytes), Ok(Some(bytes.len())));
        let (decoded, largest, total) = measure(|| decode(&bytes));
        prop_assert_eq!(decoded, Ok(f));
        prop_assert!(largest <= MAX_FRAME_LEN);
        prop_assert!(total <= 2 * MAX_FRAME_LEN);
    }

    /// Over-long texts are cut, never a panic, and what is sent still decodes.
    #[test]
    fn long_texts_are_cut_to_the_limit(s in ".{0,20}", copies in 1usize..2000) {
        let text = s.repeat(copies);
        let bytes = encode_to_vec(&Frame {
            request_id: 1,
            message: Message::Chat { to_user: 1, text: text.clone() },
        });
        let Ok(Frame { message: Message::Chat { text: sent, .. }, .. }) = decode(&bytes) else {
            panic!("chat did not decode");
        };
        if text.len() <= MAX_TEXT_LEN {
            prop_assert_eq!(sent, text);
        } else {
            // Cut at the last char boundary: at most 3 bytes (part of one char) short.
            prop_assert!(text.starts_with(&sent));
            prop_assert!(sent.len() <= MAX_TEXT_LEN && sent.len() + 3 >= MAX_TEXT_LEN);
        }
    }
}

/// The most a single frame can make `decode` allocate: the biggest recipient list, and
/// the longest text.
#[test]
fn worst_case_frames_stay_within_the_allocation_bound() {
    let worst = [
        Message::Send {
            amount_cents: 1,
            shares: 1,
            recipients: vec![u64::MAX; MAX_RECIPIENTS],
            idempotency_key: Some("k".repeat(64)),
        },
        Message::Broadcast {
            server_time_us: 1,
            text: "a".repeat(MAX_TEXT_LEN),
        },
        Message::Login {
            user_id: 1,
            token: vec![b'~'; MAX_TOKEN_LEN],
        },
    ];
    for message in worst {
        let bytes = encode_to_vec(&Frame {
            request_id: 1,
            message,
        });
        let (decoded, largest, total) = measure(|| decode(&bytes));
        assert!(decoded.is_ok());
        assert!(largest > 0, "the counter is live");
        assert!(largest <= MAX_FRAME_LEN, "one allocation of {largest}");
        assert!(total <= 2 * MAX_FRAME_LEN, "{total} bytes allocated");
    }
}
