//! Packets released at their campaign's rate by Redis (`release.lua`, on Redis's clock),
//! the packets this host holds and has not given yet, and which hosts are alive: asking
//! for the release is a host's heartbeat, and a silent host's packets go to the others.

use redis::AsyncCommands;

use crate::store::Store;
use crate::HOST_DEAD_AFTER_MS;

impl Store {
    /// The packets due to this host now, as (campaign, index), in a batch numbered after
    /// `received`, the last batch this host received (release.lua gives a batch again
    /// until it is received). Returns the batch's number and its packets.
    pub async fn release(
        &self,
        host: &str,
        received: u64,
    ) -> Result<(u64, Vec<(u32, u32)>), String> {
        let mut redis = self.redis();
        let out: Vec<redis::Value> = self
            .0
            .release
            .key("{rel}:hosts")
            .arg(host)
            .arg(HOST_DEAD_AFTER_MS)
            .arg(received)
            .invoke_async(&mut redis)
            .await
            .map_err(|e| e.to_string())?;
        let batch = match out.get(1) {
            Some(redis::Value::Int(n)) => *n as u64,
            _ => received,
        };
        let mut due = Vec::new();
        for v in out.iter().skip(2) {
            let text = match v {
                redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                redis::Value::SimpleString(s) => s.clone(),
                _ => continue,
            };
            if let Some((c, i)) = text.split_once(':') {
                if let (Ok(c), Ok(i)) = (c.parse(), i.parse()) {
                    due.push((c, i));
                }
            }
        }
        Ok((batch, due))
    }

    /// The packet is won (or created): no longer this host's to hand out.
    pub(crate) async fn given(&self, host: &str, packet: u64) {
        let (c, i) = hongbao_money::rules::shake_packet_parts(packet);
        let mut redis = self.redis();
        let _: Result<(), _> = redis
            .srem(format!("{{rel}}:held:{host}"), format!("{c}:{i}"))
            .await;
    }

    /// This host stops: what it holds goes back to the others at once.
    pub async fn forget_host(&self, host: &str) {
        let mut redis = self.redis();
        let _: Result<(), _> = redis.zadd("{rel}:hosts", host, 0).await;
    }

    pub async fn live_hosts(&self) -> Vec<String> {
        let mut redis = self.redis();
        let since = crate::now_ms().saturating_sub(HOST_DEAD_AFTER_MS);
        redis
            .zrangebyscore("{rel}:hosts", since, "+inf")
            .await
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Script;

    use crate::store::RELEASE;

    /// A standalone `redis-server` on a free loopback port, killed when dropped.
    struct TestRedis {
        child: std::process::Child,
        url: String,
    }

    impl TestRedis {
        fn start() -> TestRedis {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let child = std::process::Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("redis-server (Debian's redis-server package) is needed");
            // Killed when dropped, also if it never answers.
            let redis = TestRedis {
                child,
                url: format!("redis://127.0.0.1:{port}"),
            };
            let client = redis::Client::open(redis.url.as_str()).unwrap();
            for _ in 0..100 {
                if let Ok(mut con) = client.get_connection() {
                    if redis::cmd("PING").query::<String>(&mut con).is_ok() {
                        return redis;
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            panic!("redis-server did not answer on port {port}");
        }
    }

    impl Drop for TestRedis {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// One call of release.lua by host `h1` that says it received batch `received`:
    /// the batch's number and its packets.
    fn release(con: &mut redis::Connection, received: u64) -> (u64, Vec<String>) {
        let out: Vec<redis::Value> = Script::new(RELEASE)
            .key("{rel}:hosts")
            .arg("h1")
            .arg(HOST_DEAD_AFTER_MS)
            .arg(received)
            .invoke(con)
            .unwrap();
        let batch = match out[1] {
            redis::Value::Int(n) => n as u64,
            ref other => panic!("batch number {other:?}"),
        };
        let packets = out[2..]
            .iter()
            .map(|v| match v {
                redis::Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
                other => panic!("packet {other:?}"),
            })
            .collect();
        (batch, packets)
    }

    /// A reply of release.lua lost on the way (the script ran, the client timed out in a
    /// failover) does not lose its packets: the host gets them again, those it still
    /// holds, until it says it received them — and never twice once it has. A host that
    /// has received nothing (a process just started under a killed one's name) gets back
    /// everything its name held.
    #[test]
    fn a_released_batch_whose_reply_was_lost_is_given_again() {
        let redis = TestRedis::start();
        let mut con = redis::Client::open(redis.url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        // Ten packets at 1,000/s, started a second ago: all due at once.
        let start = crate::now_ms() - 1000;
        redis::pipe()
            .hset_multiple(
                "{rel}:c:1",
                &[
                    ("packets", 10),
                    ("rate", 1000),
                    ("start", start),
                    ("next", 0),
                ],
            )
            .sadd("{rel}:running", 1)
            .query::<()>(&mut con)
            .unwrap();

        let (batch, first) = release(&mut con, 0);
        assert_eq!(batch, 1);
        assert_eq!(first.len(), 10, "{first:?}");
        // The reply never came: asked again having received nothing (as a process just
        // started under the host's name would), what it held goes back and comes to it
        // again, numbered afresh.
        let (batch, again) = release(&mut con, 0);
        let sorted = |v: &[String]| {
            let mut v = v.to_vec();
            v.sort();
            v
        };
        assert_eq!((batch, sorted(&again)), (1, sorted(&first)));
        let held: Vec<String> = redis::cmd("SMEMBERS")
            .arg("{rel}:held:h1")
            .query(&mut con)
            .unwrap();
        assert_eq!(sorted(&held), sorted(&first));
        // Received: nothing more is due, and nothing comes twice.
        let (batch, none) = release(&mut con, 2);
        assert_eq!((batch, none.len()), (2, 0));
        // One packet won meanwhile (no longer held): a lost reply gives back only the rest.
        redis::cmd("SREM")
            .arg("{rel}:held:h1")
            .arg(&again[0])
            .query::<()>(&mut con)
            .unwrap();
        let (batch, rest) = release(&mut con, 1);
        assert_eq!((batch, &rest[..]), (3, &again[1..]));
        // A host ahead of Redis (writes lost in a failover) is believed, nothing resent.
        let (batch, none) = release(&mut con, 7);
        assert_eq!((batch, none.len()), (7, 0));
    }
}
