//! Reaching users wherever they are connected: user → host routes in Redis, publishing on
//! another host's channel until someone receives it, the notices of a new packet, and
//! keeping this host's own channel subscribed (and its Redis connection answering)
//! through failovers. A failover may cost a push, never money: the ledger keeps every
//! notice waiting until it is opened.

use std::sync::Arc;

use hongbao_money::seam::Output;
use hongbao_money::{Notice, UserId};
use redis::cluster_async::ClusterConnection;
use redis::AsyncCommands;

use crate::mesh::{channel, Mesh};
use crate::store::Store;

/// How long a route or a notice waits for Redis to answer again (a failover).
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(15);
/// How long a message is published again while nobody receives it: a hung master keeps
/// its slots for the node timeout, and the client may route to it until it wakes (seen:
/// notices dropped after 15 s with a master frozen for 8 s).
const PUBLISH_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);
/// Checks in a row (a second apart, or a timeout) with a Redis master not answering,
/// after which the cluster connection is replaced.
const STUCK_AFTER: u32 = 3;

impl Store {
    pub async fn set_route(&self, user: u64, host: &str) {
        let key = format!("route:{{{user}}}");
        self.patiently(|mut redis| {
            let (key, host) = (key.clone(), host.to_string());
            async move { redis.set::<_, _, ()>(key, host).await }
        })
        .await;
    }

    pub async fn clear_route(&self, user: u64, host: &str) {
        if self.route(user).await.as_deref() == Some(host) {
            let mut redis = self.redis();
            let _: Result<(), _> = redis.del(format!("route:{{{user}}}")).await;
        }
    }

    /// The host `user` is connected to, if any (asked again through a failover).
    pub async fn route(&self, user: u64) -> Option<String> {
        self.route_known(user).await.flatten()
    }

    /// `Some(route)` as Redis knows it, `None` when Redis did not answer for `PATIENCE`.
    async fn route_known(&self, user: u64) -> Option<Option<String>> {
        let key = format!("route:{{{user}}}");
        self.patiently(|mut redis| {
            let key = key.clone();
            async move { redis.get::<_, Option<String>>(key).await }
        })
        .await
    }

    /// `msg` on `host`'s channel. Sent again while nobody received it (SPUBLISH counts
    /// the receivers) or Redis did not answer: after a failover the host's subscription
    /// moves to the new master a moment after publishers can reach it, and pub/sub keeps
    /// nothing for later.
    pub(crate) async fn publish(&self, host: &str, msg: &Mesh) {
        let text = serde_json::to_string(msg).expect("serializable");
        let channel = channel(host);
        let deadline = tokio::time::Instant::now() + PUBLISH_PATIENCE;
        loop {
            let received = self
                .patiently(|mut redis| {
                    let (channel, text) = (channel.clone(), text.clone());
                    async move {
                        redis::cmd("SPUBLISH")
                            .arg(channel)
                            .arg(text)
                            .query_async::<i64>(&mut redis)
                            .await
                    }
                })
                .await;
            // Received by someone: done. Nobody (0), or no answer from Redis at all
            // (`None`, a failover longer than `PATIENCE`): not delivered, so again.
            if received.is_some_and(|n| n > 0) {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    "nobody on {channel} received a message for {} s; dropped",
                    PUBLISH_PATIENCE.as_secs()
                );
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// Keeps this host subscribed to its channel, for as long as the runtime runs. A
    /// Redis master failing over takes its subscribers' subscriptions with it, and the
    /// client does not always subscribe again on the new master (seen here: every notice
    /// published to a host for 15 s after a failover reached nobody). So once a second
    /// the host publishes an empty message on its own channel (not JSON: `on_push`
    /// ignores it) and, when nobody received it, subscribes again — on whichever node
    /// owns the channel's slot now.
    ///
    /// The connection is checked too, with the message and a probe of every master: a
    /// cluster connection can stay stuck after a master's failover, every command timing
    /// out while other hosts' connections recovered (seen in the lab: two of three hosts,
    /// until the end of the run), and a master that hangs (SIGSTOP: its connections open
    /// and silent) keeps the client sending its slots there even after its replica took
    /// over. After `STUCK_AFTER` checks in a row with a master not answering, a new
    /// connection is made (it learns the cluster's slots afresh) and replaces it.
    ///
    /// Each time the channel was subscribed again or the connection replaced, `renewed`
    /// is told: a message published while the subscription was gone may have been
    /// counted as received by a master that died before passing it on, so the host
    /// tells its users their waiting notices again (`Host::renew_notices`).
    ///
    /// The probes are this host's markers, one on every master, written once: a marker
    /// found missing later means its master lost its data (restarted without
    /// persistence, or a replica promoted before it had synced), and perhaps routes of
    /// this host's users with it; `lost` is told, and the host tells Redis again what it
    /// should know (`Host::fresh`).
    pub async fn keep_subscribed(
        self,
        host: String,
        renewed: Arc<tokio::sync::Notify>,
        lost: Arc<tokio::sync::Notify>,
    ) {
        let channel = channel(&host);
        // Keys whose slots fall on every master (32 hash tags: the chance that one of
        // three masters owns none of them is below one in 100,000).
        let probes: Vec<String> = (0..32)
            .map(|i| format!("{{hb-probe-{i}}}:{host}"))
            .collect();
        let mut every = tokio::time::interval(std::time::Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut unanswered = 0;
        let mut marked = false;
        loop {
            every.tick().await;
            let mut redis = self.redis();
            let received = redis::cmd("SPUBLISH")
                .arg(&channel)
                .arg("")
                .query_async::<i64>(&mut redis)
                .await;
            // A master that hangs (its connection open and silent) keeps the client
            // sending its slots there: every probe must answer. A probe writes its
            // marker if it is missing (and says so).
            let probed = futures_util::future::join_all(probes.iter().map(|key| {
                let mut redis = redis.clone();
                async move {
                    redis::cmd("SET")
                        .arg(key)
                        .arg(1)
                        .arg("NX")
                        .query_async::<Option<String>>(&mut redis)
                        .await
                }
            }))
            .await;
            let all_answered = probed.iter().all(|r| r.is_ok());
            if probed.iter().any(|r| matches!(r, Ok(Some(_)))) && marked {
                tracing::warn!(
                    "a Redis master lost its data (a marker of this host is gone); telling Redis again what it should know"
                );
                lost.notify_one();
            }
            marked |= all_answered;
            if let Ok(0) = received {
                let mut subscribed = self.0.subscribed.lock().unwrap().clone();
                match subscribed.ssubscribe(&channel).await {
                    Ok(()) => {
                        tracing::info!("subscribed to {channel} again");
                        renewed.notify_one();
                    }
                    Err(e) => tracing::warn!("subscribing to {channel} again: {e}"),
                }
            }
            if received.is_ok() && all_answered {
                unanswered = 0;
                continue;
            }
            unanswered += 1;
            if unanswered >= STUCK_AFTER {
                unanswered = 0;
                if self.reconnect_redis(&channel).await {
                    renewed.notify_one();
                }
            }
        }
    }

    /// New cluster connections, one for commands and one subscribed to `channel`, in
    /// place of the current ones; whether they were replaced.
    async fn reconnect_redis(&self, channel: &str) -> bool {
        let connect = async {
            let client = &self.0.redis_client;
            let commands = client.get_async_connection().await?;
            let mut subscribed = client.get_async_connection().await?;
            subscribed.ssubscribe(channel).await?;
            Ok::<_, redis::RedisError>((commands, subscribed))
        };
        let (commands, subscribed) = match tokio::time::timeout(PATIENCE, connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                tracing::warn!("Redis: connecting again: {e}");
                return false;
            }
            Err(_) => {
                tracing::warn!("Redis: connecting again: timed out");
                return false;
            }
        };
        *self.0.redis.lock().unwrap() = commands;
        *self.0.subscribed.lock().unwrap() = subscribed;
        tracing::warn!(
            "Redis: a master did not answer {STUCK_AFTER} checks in a row; connected to the cluster again"
        );
        true
    }

    /// `ask` until Redis answers, for up to `PATIENCE` (a master failing over takes the
    /// node timeout and an election, a few seconds): a route or a notice is not dropped
    /// for a failover. `None` if Redis never answered.
    async fn patiently<T, F, Fut>(&self, mut ask: F) -> Option<T>
    where
        F: FnMut(ClusterConnection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            match ask(self.redis()).await {
                Ok(v) => return Some(v),
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    tracing::warn!("Redis: {e}");
                    return None;
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
            }
        }
    }

    /// Notices for a new packet's recipients: here, on their host's channel, or waiting
    /// in the ledger for their next login. A recipient whose route Redis could not tell
    /// (its master failing over) is told on every live host: a host where the user is
    /// not connected drops the notice, and a client drops a notice it already had.
    pub(crate) async fn notify(
        &self,
        host: &str,
        recipients: &[u64],
        notice: Notice,
    ) -> Vec<Output> {
        let mut here = Vec::new();
        for &user in recipients {
            let Some(id) = UserId::new(user) else {
                continue;
            };
            match self.route_known(user).await {
                Some(Some(there)) if there == host => {
                    here.push(Output::Notice { user: id, notice })
                }
                Some(Some(there)) => self.publish(&there, &Mesh::Notice { user, notice }).await,
                Some(None) => {}
                None => {
                    here.push(Output::Notice { user: id, notice });
                    for there in self.live_hosts().await {
                        if there != host {
                            self.publish(&there, &Mesh::Notice { user, notice }).await;
                        }
                    }
                }
            }
        }
        here
    }
}
