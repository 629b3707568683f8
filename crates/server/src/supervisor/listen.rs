//! The listening sockets, owned by the supervisor: for each address (client, WebSocket,
//! HTTP) one SO_REUSEPORT group with a socket a worker, the kernel spreading connections
//! over them. A worker inherits its sockets at exec (`hongbao worker --listener FD`);
//! the supervisor keeps them, so that they can be handed whole — accept queues and all —
//! to the binary an upgrade starts (`upgrade.rs`): no connection attempt finds the port
//! closed while one server gives way to the next.
//!
//! A worker that dies has its sockets closed (what waited in their queues is reset and
//! tries again elsewhere, as when a process holding its own socket dies), and gets new
//! ones in the group when it is started again. A drain closes them all.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use hongbao_money::WorkerId;
use hongbao_sys::net;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Which address a group listens for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    Client,
    WebSocket,
    Http,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Client => "client",
            Kind::WebSocket => "WebSocket",
            Kind::Http => "HTTP",
        }
    }

    /// Whether its connections speak HTTP (WebSocket and the HTTP API both do).
    pub fn http(self) -> bool {
        self != Kind::Client
    }
}

/// One address's SO_REUSEPORT group.
struct Group {
    kind: Kind,
    addr: SocketAddr,
    /// Worker `w` of `n` takes every socket whose index is `w` modulo `n`: one each when
    /// the server made them, several each after an upgrade from a server with more
    /// workers (closing the spare ones would reset what waits in their queues).
    sockets: Vec<Option<TcpListener>>,
}

/// Every listening socket of this server.
pub(super) struct Sockets {
    groups: Vec<Group>,
}

/// A group as handed over in an upgrade: its descriptors go beside the message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupShape {
    pub kind: Kind,
    pub addr: SocketAddr,
    pub sockets: u32,
}

fn bind(kind: Kind, addr: SocketAddr) -> Result<TcpListener> {
    net::reuseport_listener(addr, true)
        .map_err(|e| Error::io(format!("binding the {} address {addr}", kind.name()), e))
}

impl Sockets {
    /// A group for each address given (`""` for none), `workers` sockets each. ":0"
    /// resolves once, with the first socket, and the rest join it.
    pub(super) fn bind(addrs: &[(Kind, &str)], workers: usize) -> Result<Sockets> {
        let mut groups = Vec::new();
        for &(kind, addr) in addrs {
            if addr.is_empty() {
                continue;
            }
            let requested: SocketAddr = addr
                .parse()
                .map_err(|e| Error::config(format!("the {} address {addr:?}: {e}", kind.name())))?;
            // A port another process listens on is refused, saying which: SO_REUSEPORT
            // would let this server join it, and the kernel split clients between two
            // ledgers.
            net::ensure_free(requested)
                .map_err(|e| Error::io(format!("the {} address {requested}", kind.name()), e))?;
            let first = bind(kind, requested)?;
            let addr = first
                .local_addr()
                .map_err(|e| Error::io("reading a bound address", e))?;
            let mut sockets = vec![Some(first)];
            for _ in 1..workers.max(1) {
                sockets.push(Some(bind(kind, addr)?));
            }
            groups.push(Group {
                kind,
                addr,
                sockets,
            });
        }
        Ok(Sockets { groups })
    }

    /// The sockets an upgrade handed over (`shapes`, their descriptors in order), and new
    /// ones in the same groups where this server has more workers than they were made for.
    pub(super) fn adopt(
        shapes: &[GroupShape],
        fds: Vec<OwnedFd>,
        workers: usize,
    ) -> Result<Sockets> {
        let mut fds = fds.into_iter();
        let mut groups = Vec::new();
        for shape in shapes {
            let mut sockets = Vec::new();
            for _ in 0..shape.sockets {
                let fd = fds.next().ok_or_else(|| {
                    Error::Link("the upgrade handed over fewer sockets than it said".into())
                })?;
                let socket = TcpListener::from(fd);
                let addr = socket
                    .local_addr()
                    .map_err(|e| Error::io("reading a socket handed over", e))?;
                if addr != shape.addr {
                    return Err(Error::Link(format!(
                        "a {} socket handed over listens on {addr}, not {}",
                        shape.kind.name(),
                        shape.addr
                    )));
                }
                sockets.push(Some(socket));
            }
            while sockets.len() < workers {
                sockets.push(Some(bind(shape.kind, shape.addr)?));
            }
            groups.push(Group {
                kind: shape.kind,
                addr: shape.addr,
                sockets,
            });
        }
        Ok(Sockets { groups })
    }

    /// Where `kind` listens, if it does.
    pub(super) fn addr(&self, kind: Kind) -> Option<SocketAddr> {
        self.groups.iter().find(|g| g.kind == kind).map(|g| g.addr)
    }

    /// Worker `w`'s sockets (of `workers`), made again where it lost them: (descriptor,
    /// speaks HTTP).
    pub(super) fn for_worker(&mut self, w: WorkerId, workers: usize) -> Result<Vec<(RawFd, bool)>> {
        let mut out = Vec::new();
        for g in &mut self.groups {
            for (i, socket) in g.sockets.iter_mut().enumerate() {
                if i % workers.max(1) != usize::from(w) {
                    continue;
                }
                if socket.is_none() {
                    *socket = Some(bind(g.kind, g.addr)?);
                }
                let fd = socket.as_ref().expect("bound").as_raw_fd();
                out.push((fd, g.kind.http()));
            }
        }
        Ok(out)
    }

    /// Worker `w` died: its sockets close with it (what waits in their queues tries again
    /// elsewhere).
    pub(super) fn close_worker(&mut self, w: WorkerId, workers: usize) {
        for g in &mut self.groups {
            for (i, socket) in g.sockets.iter_mut().enumerate() {
                if i % workers.max(1) == usize::from(w) {
                    *socket = None;
                }
            }
        }
    }

    /// Every socket closed (a drain, or handed over): the supervisor holds none open.
    pub(super) fn close_all(&mut self) {
        for g in &mut self.groups {
            g.sockets.clear();
        }
    }

    /// What an upgrade hands over: the groups' shapes, and their open descriptors in the
    /// same order.
    pub(super) fn handover(&self) -> (Vec<GroupShape>, Vec<RawFd>) {
        let mut shapes = Vec::new();
        let mut fds = Vec::new();
        for g in &self.groups {
            let open: Vec<RawFd> = g.sockets.iter().flatten().map(|s| s.as_raw_fd()).collect();
            shapes.push(GroupShape {
                kind: g.kind,
                addr: g.addr,
                sockets: open.len() as u32,
            });
            fds.extend(open);
        }
        (shapes, fds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_worker_takes_its_share_and_a_dead_ones_are_made_again() {
        let mut s = Sockets::bind(&[(Kind::Client, "127.0.0.1:0"), (Kind::Http, "")], 2).unwrap();
        let addr = s.addr(Kind::Client).unwrap();
        assert_ne!(addr.port(), 0);
        assert!(s.addr(Kind::Http).is_none());
        let w0 = s.for_worker(0, 2).unwrap();
        let w1 = s.for_worker(1, 2).unwrap();
        assert_eq!((w0.len(), w1.len()), (1, 1));
        assert_ne!(w0[0].0, w1[0].0);
        s.close_worker(1, 2);
        let again = s.for_worker(1, 2).unwrap();
        assert_eq!(again.len(), 1);
        // Handed over to a server of one worker: it takes both.
        let (shapes, fds) = s.handover();
        let owned: Vec<OwnedFd> = fds
            .iter()
            .map(|&fd| {
                // SAFETY: borrowed for the length of this call to be duplicated.
                unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
                    .try_clone_to_owned()
                    .unwrap()
            })
            .collect();
        let mut next = Sockets::adopt(&shapes, owned, 1).unwrap();
        assert_eq!(next.for_worker(0, 1).unwrap().len(), 2);
        assert_eq!(next.addr(Kind::Client), Some(addr));
        // And to one of three: a third socket joins the group.
        let (shapes, fds) = next.handover();
        let owned: Vec<OwnedFd> = fds
            .iter()
            .map(|&fd| {
                // SAFETY: as above.
                unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
                    .try_clone_to_owned()
                    .unwrap()
            })
            .collect();
        let mut three = Sockets::adopt(&shapes, owned, 3).unwrap();
        assert_eq!(three.for_worker(2, 3).unwrap().len(), 1);
    }
}
