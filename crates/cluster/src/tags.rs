//! The release's Redis hash tags (docs/scale-out.md, "The release over several slots"):
//! each tag's name, which tag releases a campaign's packet, how many packets a tag
//! releases, and which tag a host asks at each tick.

/// The hash tag of the release's tag `t`, which every key of that part of the release is
/// under: tag 0 is `{rel}`, the release's one tag before there were several (so one tag
/// is the release as it was, key for key, and a host of the version before works beside
/// this one), and tag t > 0 is `{rel.t}`, another slot.
pub(crate) fn release_tag(t: u32) -> String {
    if t == 0 {
        "{rel}".to_string()
    } else {
        format!("{{rel.{t}}}")
    }
}

/// The tag of `tags` that releases a campaign's packet `index`.
pub(crate) fn tag_of(index: u32, tags: u32) -> u32 {
    index % tags
}

/// How many of a campaign's `packets` tag `t` of `tags` releases: the indexes below
/// `packets` that are t mod `tags` (release.lua counts the packets due the same way).
pub(crate) fn tag_packets(packets: u32, tags: u32, t: u32) -> u32 {
    if packets <= t {
        0
    } else {
        (packets - t).div_ceil(tags)
    }
}

/// The tag a host asks at its release tick `turn`: one tag a tick, each in turn, from an
/// offset drawn from the host's name, so that a tag hears from every host every
/// `tags` ticks (10 ms × K, far inside the 3 s after which a host is dead) and the hosts'
/// calls spread over the tags instead of arriving together. Each tag then takes
/// H × (1000 / tick) / K calls a second rather than H × (1000 / tick): what makes K
/// divide a tag's load (docs/scale-out.md, "The release over several slots").
pub(crate) fn tag_in_turn(host: &str, turn: u64, tags: u32) -> u32 {
    let offset = host.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (offset.wrapping_add(turn) % u64::from(tags.max(1))) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tag 0 is the release's tag from before there were several; each tag's share of a
    /// count is the indexes below it that are t mod K, so the shares add up to the count,
    /// whatever it is and whatever K (release.lua counts what is due so).
    #[test]
    fn each_tags_share_of_a_count_is_its_indexes_and_the_shares_add_up() {
        assert_eq!(release_tag(0), "{rel}");
        assert_eq!(release_tag(2), "{rel.2}");
        for tags in 1..=8 {
            for count in 0..200 {
                let shares: Vec<u32> = (0..tags).map(|t| tag_packets(count, tags, t)).collect();
                assert_eq!(shares.iter().sum::<u32>(), count, "K {tags}, {count}");
                for (t, share) in (0..tags).zip(shares) {
                    let mine = (0..count).filter(|&i| tag_of(i, tags) == t).count() as u32;
                    assert_eq!(share, mine, "K {tags}, {count}, tag {t}");
                }
            }
        }
    }

    #[test]
    fn a_host_asks_each_tag_in_turn_and_hosts_spread_over_them() {
        for tags in [1, 3, 8] {
            for host in ["gw1", "gw2", "a-much-longer-host-name"] {
                let asked: Vec<u32> = (0..tags as u64 * 2)
                    .map(|turn| tag_in_turn(host, turn, tags))
                    .collect();
                // Every tag once in any `tags` consecutive ticks.
                for window in asked.windows(tags as usize) {
                    let mut seen = window.to_vec();
                    seen.sort_unstable();
                    assert_eq!(seen, (0..tags).collect::<Vec<_>>(), "{host} {asked:?}");
                }
            }
        }
        // Hosts start at different tags: 100 hosts' first ticks cover all of 8.
        let first: std::collections::BTreeSet<u32> = (0..100)
            .map(|h| tag_in_turn(&format!("gw{h}"), 0, 8))
            .collect();
        assert_eq!(first.len(), 8);
    }
}
