//! The backend as the supervisor holds it: [`Cluster`] is the cluster's side of the
//! `Money` seam. Each call becomes a command for this host's loop, on a tokio runtime on a
//! thread of its own (`host`), so the gateway never waits on Redis or PostgreSQL; outputs
//! come back through `drain` and the waker.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hongbao_money::seam::{
    AdminRequest, Balances, LedgerRead, MoneySnapshot, Op, OpsCursor, OpsPage, Origin, Output,
};
use hongbao_money::{Audit, Error, Money, UserId, UserView, WorkerId};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use crate::host::{Cmd, Host, Read};
use crate::shared::Shared;
use crate::store::Store;
use crate::ClusterConfig;

/// The backend, as the supervisor holds it.
pub struct Cluster {
    tx: UnboundedSender<Cmd>,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Cluster {
    /// Connects to Redis and PostgreSQL (creating the schema if it is not there) and
    /// starts this host's part: releasing, committing, listening on its channel.
    pub fn open(cfg: ClusterConfig, wake: Arc<dyn Fn() + Send + Sync>) -> Result<Cluster, Error> {
        let shared = Arc::new(Shared {
            outputs: Mutex::default(),
            snapshot: Mutex::default(),
            // Two minutes at 2 significant digits, as the embedded ledger's.
            commit_latency: Mutex::new(
                hdrhistogram::Histogram::new_with_bounds(1, 120_000_000, 2)
                    .expect("valid histogram bounds"),
            ),
            standby_sync: Mutex::default(),
            failure: Mutex::default(),
            wake,
        });
        let (tx, rx) = unbounded_channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let runtime_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("hongbao-cluster".into())
            .spawn(move || {
                let _span = tracing::info_span!("cluster", host = %cfg.host).entered();
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ =
                            ready_tx.send(Err(Error::unavailable("starting a tokio runtime", e)));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let store = match Store::connect(&cfg).await {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    Host::new(cfg, store, runtime_shared).run(rx).await;
                });
            })
            .map_err(|e| Error::unavailable("starting the cluster's thread", e))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Cluster {
                tx,
                shared,
                thread: Some(thread),
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::bug("the cluster runtime ended while starting")),
        }
    }

    /// Reads of the ledger for the admin API's threads.
    pub fn reader(&self) -> Box<dyn LedgerRead> {
        Box::new(Reader {
            tx: Mutex::new(self.tx.clone()),
        })
    }

    fn send(&self, cmd: Cmd) {
        if self.tx.send(cmd).is_err() {
            self.shared
                .failure
                .lock()
                .unwrap()
                .get_or_insert_with(|| "the cluster runtime has ended".into());
        }
    }
}

impl Money for Cluster {
    fn submit(&mut self, now_ms: u64, origin: Origin, op: Op) {
        self.send(Cmd::Submit(now_ms, origin, op));
    }

    fn admin(&mut self, _now_ms: u64, ticket: u64, request: AdminRequest) {
        self.send(Cmd::Admin(ticket, request));
    }

    /// Time is kept by the runtime (and the release by Redis's clock).
    fn tick(&mut self, _now_ms: u64) {}

    fn worker_up(&mut self, worker: WorkerId) {
        self.send(Cmd::WorkerUp(worker));
    }

    fn worker_down(&mut self, worker: WorkerId) {
        self.send(Cmd::WorkerDown(worker));
    }

    fn drain(&mut self, out: &mut Vec<Output>) {
        out.append(&mut self.shared.outputs.lock().unwrap());
    }

    fn snapshot(&self) -> MoneySnapshot {
        self.shared.snapshot.lock().unwrap().clone()
    }

    fn audit_now(&self) -> Option<Audit> {
        None
    }

    fn commit_latency(&self) -> Option<hdrhistogram::Histogram<u64>> {
        Some(self.shared.commit_latency.lock().unwrap().clone())
    }

    fn standby_sync(&self) -> Option<bool> {
        *self.shared.standby_sync.lock().unwrap()
    }

    fn failure(&self) -> Option<String> {
        self.shared.failure.lock().unwrap().clone()
    }

    fn finish(&mut self) -> Result<(), Error> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.send(Cmd::Finish(tx));
        let result = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| {
                Err(Error::unavailable(
                    "finishing",
                    "the cluster runtime did not finish in 30 s",
                ))
            });
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        result
    }

    fn online(&mut self, user: UserId) {
        self.send(Cmd::Online(user));
    }

    fn offline(&mut self, user: UserId) {
        self.send(Cmd::Offline(user));
    }

    fn chat_elsewhere(&mut self, origin: Origin, to_user: u64, text: String) -> bool {
        self.send(Cmd::Chat(origin, to_user, text));
        true
    }

    fn broadcast_elsewhere(&mut self, server_time_us: u64, text: String) {
        self.send(Cmd::Broadcast(server_time_us, text));
    }
}

struct Reader {
    tx: Mutex<UnboundedSender<Cmd>>,
}

impl Reader {
    fn ask<T>(
        &self,
        make: impl FnOnce(std::sync::mpsc::Sender<Result<T, Error>>) -> Read,
    ) -> Result<T, Error> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.tx
            .lock()
            .unwrap()
            .send(Cmd::Read(make(tx)))
            .map_err(|_| Error::bug("the cluster runtime has ended"))?;
        rx.recv_timeout(Duration::from_secs(30)).map_err(|_| {
            Error::unavailable(
                "reading the ledger",
                "no answer from the cluster runtime in 30 s",
            )
        })?
    }
}

impl LedgerRead for Reader {
    fn user(&self, user: u64, limit: usize) -> Result<UserView, Error> {
        self.ask(|tx| Read::User(user, limit, tx))
    }

    fn balances(&self) -> Result<Balances, Error> {
        self.ask(Read::Balances)
    }

    fn ops(&self, after: Option<OpsCursor>, limit: usize) -> Result<OpsPage, Error> {
        self.ask(|tx| Read::Ops(after, limit, tx))
    }
}
