//! A service of this machine made reachable from the lab's hosts: a TCP relay from the
//! bridge's address to a loopback address (the bench's monitor listens on 127.0.0.1,
//! which a host in a namespace of its own cannot reach).

use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};

/// Relays connections from `addr` to a target until dropped (connections under way end
/// on their own).
pub struct Relay {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Relay {
    /// Listens on `addr` and relays every connection to `target`.
    pub fn start(addr: SocketAddr, target: SocketAddr) -> Result<Relay> {
        let listening = || format!("relay: listening on {addr}");
        let listener = TcpListener::bind(addr).map_err(|e| Error::io(listening(), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io(listening(), e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::Builder::new()
            .name(format!("relay {addr}"))
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            let _ = client.set_nonblocking(false);
                            if let Ok(server) = TcpStream::connect(target) {
                                pipe(client, server);
                            }
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(20))
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })
            .map_err(|e| Error::io(format!("relay: starting the thread of {addr}"), e))?;
        Ok(Relay { addr, stop })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Copies both ways between `a` and `b` on two threads; each direction passes on the
/// end of its stream.
fn pipe(a: TcpStream, b: TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let one_way = |mut from: TcpStream, mut to: TcpStream| {
        move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Write);
        }
    };
    std::thread::spawn(one_way(a, b2));
    std::thread::spawn(one_way(b, a2));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// Bytes go both ways through the relay, and each side's end reaches the other.
    #[test]
    fn a_relay_carries_both_ways() {
        let target = TcpListener::bind("127.0.0.1:0").unwrap();
        let target_addr = target.local_addr().unwrap();
        let free = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let relay = Relay::start(free, target_addr).unwrap();
        let echo = std::thread::spawn(move || {
            let (mut s, _) = target.accept().unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            s.write_all(&got).unwrap();
        });
        let mut c = TcpStream::connect(relay.addr()).unwrap();
        c.write_all(b"report").unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        c.read_to_end(&mut back).unwrap();
        assert_eq!(back, b"report");
        echo.join().unwrap();
    }
}
