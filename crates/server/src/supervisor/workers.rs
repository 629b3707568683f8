//! The supervisor's side of the gateway workers: starting them (this same binary,
//! `hongbao worker`), their links (one Unix stream each, length-prefixed messages both
//! ways), restarting a worker that dies, and stopping them all in order.

use std::io::{ErrorKind, Read};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hongbao_money::WorkerId;
use hongbao_sys::clock::Uptime;
use hongbao_sys::net;
use mio::net::UnixStream;
use mio::{Events, Interest, Token};

use super::event_loop::{Supervisor, WAKER};
use super::procs::{Link, MAX_LINK_BACKLOG};
use crate::error::{Error, Result};
use crate::link::{self, ToSupervisor, ToWorker};

impl Supervisor {
    /// Starts worker `w` from the supervisor's own binary: `/proc/self/exe`, which names
    /// it even after the file on disk was replaced or removed (a deploy, a rebuild) — a
    /// worker must speak its supervisor's link, and a restart must not fail for want of
    /// a path.
    ///
    /// Its link is one end of a socketpair made for it, and its listening sockets are the
    /// supervisor's (`listen.rs`), all inherited at exec under the numbers its arguments
    /// give: there is no address a stranger could connect to, so only this worker is
    /// ever welcomed (and told the login secret).
    pub(super) fn spawn_worker(&mut self, w: WorkerId) -> Result<Child> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| Error::io(format!("making worker {w}'s link"), e))?;
        let listeners = self.sockets.for_worker(w, self.workers_wanted)?;
        let mut inherited: Vec<i32> = listeners.iter().map(|&(fd, _)| fd).collect();
        inherited.push(theirs.as_raw_fd());
        let name = std::env::args_os()
            .next()
            .unwrap_or_else(|| "hongbao".into());
        let mut command = Command::new("/proc/self/exe");
        command
            .arg0(name)
            .arg("worker")
            .arg("--link-fd")
            .arg(theirs.as_raw_fd().to_string())
            .arg("--index")
            .arg(w.to_string());
        for (fd, http) in listeners {
            let flag = if http {
                "--http-listener"
            } else {
                "--listener"
            };
            command.arg(flag).arg(fd.to_string());
        }
        command
            .stdin(Stdio::null())
            // The supervisor alone speaks for the service to systemd.
            .env_remove(hongbao_sys::notify::NOTIFY_SOCKET);
        // SAFETY: runs in the forked child before exec and only calls fcntl(2), which is
        // async-signal-safe, on descriptors the child has (copies of the supervisor's):
        // clearing FD_CLOEXEC lets exactly these survive the exec, under the same numbers.
        unsafe {
            command.pre_exec(move || {
                for &fd in &inherited {
                    let flags = libc::fcntl(fd, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .map_err(|e| Error::io(format!("starting worker {w}"), e))?;
        drop(theirs);
        ours.set_nonblocking(true)
            .map_err(|e| Error::io(format!("worker {w}'s link"), e))?;
        let mut stream = UnixStream::from_std(ours);
        let entry = self.links.vacant_entry();
        self.poll
            .registry()
            .register(
                &mut stream,
                Token(entry.key()),
                Interest::READABLE | Interest::WRITABLE,
            )
            .map_err(|e| Error::io("watching a worker's link", e))?;
        entry.insert(Link {
            stream,
            worker: None,
            expected: w,
            inbuf: Vec::new(),
            outbuf: Vec::new(),
        });
        Ok(child)
    }

    pub(super) fn read_link(&mut self, key: usize) {
        let mut chunk = [0u8; 64 * 1024];
        let mut closed = false;
        let Some(link) = self.links.get_mut(key) else {
            return;
        };
        loop {
            match link.stream.read(&mut chunk) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => link.inbuf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        let mut inbox = Vec::new();
        if let Err(e) = link::decode_all::<ToSupervisor>(&mut link.inbuf, |m| inbox.push(m)) {
            tracing::warn!(error = %e, "dropping a worker link");
            closed = true;
        }
        let now = self.time.unix().as_millis();
        for msg in inbox {
            match self.links[key].worker {
                Some(w) => self.on_worker_message(w, msg, now),
                None => self.hello(key, msg),
            }
        }
        if closed {
            self.drop_link(key);
        }
    }

    /// A new link's first message names its worker: the one it was made for, or the link
    /// is dropped.
    fn hello(&mut self, key: usize, msg: ToSupervisor) {
        let ToSupervisor::Hello { worker: w, .. } = msg else {
            return;
        };
        if w != self.links[key].expected {
            tracing::warn!(
                said = w,
                made_for = self.links[key].expected,
                "a worker named another's index; dropping its link"
            );
            self.drop_link(key);
            return;
        }
        // A worker index can have one link: an older one (a worker that was replaced
        // before its link closed) goes down first, returning its pool.
        if let Some(old) = self.worker_links.get(&w).copied() {
            self.drop_link(old);
        }
        self.worker_links.insert(w, key);
        self.links[key].worker = Some(w);
        self.money.worker_up(w);
        let welcome = ToWorker::Welcome(Box::new(self.welcome()));
        link::encode(&welcome, &mut self.links[key].outbuf);
    }

    pub(super) fn drop_link(&mut self, key: usize) {
        if !self.links.contains(key) {
            return;
        }
        let mut link = self.links.remove(key);
        let _ = self.poll.registry().deregister(&mut link.stream);
        let Some(w) = link.worker else {
            return;
        };
        if self.worker_links.get(&w) == Some(&key) {
            self.worker_links.remove(&w);
            self.money.worker_down(w);
            // Its users are offline here now (in cluster mode: no longer this host's
            // share of the packets, their routes cleared).
            for user in self.presence.worker_down(w) {
                self.money.offline(user);
            }
            self.retire_stats(w);
            for b in self.broadcasts.values_mut() {
                b.waiting.retain(|&x| x != w);
            }
            self.answer_broadcasts(false, self.time.now);
        }
    }

    pub(super) fn flush_links(&mut self) {
        let mut dead = Vec::new();
        for (key, link) in self.links.iter_mut() {
            match net::write_nonblocking(&mut link.stream, &link.outbuf) {
                Ok(n) => link::consumed(&mut link.outbuf, n),
                Err(_) => dead.push(key),
            }
            if link.outbuf.len() > MAX_LINK_BACKLOG {
                tracing::warn!(
                    worker = ?link.worker,
                    "a worker is not reading its link; dropping it"
                );
                dead.push(key);
            }
        }
        for key in dead {
            self.drop_link(key);
        }
    }

    pub(super) fn check_workers(&mut self, now: Uptime) -> Result<()> {
        if self.shutting_down {
            return Ok(());
        }
        let ids: Vec<WorkerId> = self.workers.keys().copied().collect();
        for w in ids {
            let proc_ = self.workers.get_mut(&w).expect("listed");
            if let Some(child) = proc_.child.as_mut() {
                let waited = child.try_wait();
                if let Some(status) = waited.map_err(|e| Error::io("waiting for a worker", e))? {
                    tracing::warn!(
                        worker = w,
                        pid = child.id(),
                        %status,
                        "a worker exited; restarting it"
                    );
                    proc_.child = None;
                    proc_.start_later(now);
                    self.sockets.close_worker(w, self.workers_wanted);
                    if let Some(key) = self.worker_links.get(&w).copied() {
                        self.drop_link(key);
                    }
                }
            }
            let proc_ = self.workers.get_mut(&w).expect("listed");
            if proc_.child.is_none() && proc_.respawn_at.is_some_and(|t| now >= t) {
                proc_.respawn_at = None;
                match self.spawn_worker(w) {
                    Ok(child) => self.workers.get_mut(&w).expect("listed").child = Some(child),
                    Err(e) => {
                        // The others serve on; this one is tried again, later each time.
                        let delay = self.workers.get_mut(&w).expect("listed").start_later(now);
                        tracing::error!(
                            worker = w,
                            error = format!("{e:#}"),
                            retry_in = ?delay,
                            "starting a worker again failed"
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// Tells every worker to shut down (they kick their clients with the reason), reads
    /// their last reports while they go, then makes sure they are gone.
    pub(super) fn stop_workers(&mut self) {
        self.shutting_down = true;
        for link in self.links.iter_mut().map(|(_, l)| l) {
            link::encode(&ToWorker::Shutdown, &mut link.outbuf);
        }
        self.flush_links();
        let deadline = self.time.clock.now() + Duration::from_secs(3);
        let mut events = Events::with_capacity(64);
        while !self.worker_links.is_empty() && self.time.clock.now() < deadline {
            let _ = self.poll.poll(&mut events, Some(Duration::from_millis(10)));
            for event in events.iter() {
                let Token(key) = event.token();
                if key != WAKER.0 {
                    self.read_link(key);
                }
            }
        }
        for proc_ in self.workers.values_mut() {
            if let Some(child) = proc_.child.as_mut() {
                while self.time.clock.now() < deadline {
                    if let Ok(Some(_)) = child.try_wait() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    fn retire_stats(&mut self, w: WorkerId) {
        let Some(proc_) = self.workers.get_mut(&w) else {
            return;
        };
        if let Some(last) = proc_.latest.take() {
            self.report.retire(&last);
        }
        proc_.previous = None;
    }
}
