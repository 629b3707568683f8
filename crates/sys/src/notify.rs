//! Telling a service manager how a long-running command is doing: systemd's notify
//! protocol (sd_notify(3)). When systemd starts a `Type=notify` service it puts the
//! address of a Unix datagram socket in `NOTIFY_SOCKET`; the service sends one datagram
//! per change of state, newline-separated `KEY=VALUE` lines: `READY=1` once it serves
//! (systemd holds back the units ordered after it until then), `STATUS=…` for
//! `systemctl status`, `RELOADING=1` and `STOPPING=1`.
//!
//! The address is a path (`/run/systemd/notify`) or, with a leading `@`, a name in
//! Linux's abstract namespace (what systemd uses inside containers and what tests bind:
//! no file to clean up). Anything else (`vsock:`) is refused with a reason.
//!
//! A few lines of our own over std's datagram socket rather than a crate: the protocol is
//! one `sendto`. The socket is non-blocking, so a manager that does not read (a full
//! queue) is an error for the caller to log, never a stuck loop; the variable is left
//! for the caller to keep away from its children (a worker must not speak for the
//! service).

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The variable systemd names the socket in.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// A way to the service manager's notify socket.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    to: SocketAddr,
    /// The address as given, for messages.
    named: String,
}

impl Notifier {
    /// From `NOTIFY_SOCKET`: `Ok(None)` when it is unset or empty (not under a manager
    /// that listens), an error when it names an address this cannot reach.
    pub fn from_env() -> io::Result<Option<Notifier>> {
        match std::env::var_os(NOTIFY_SOCKET) {
            Some(value) if !value.is_empty() => {
                let value = value.to_str().ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, "NOTIFY_SOCKET is not UTF-8")
                })?;
                Notifier::to(value).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// To the socket at `address`: a path, or `@name` in the abstract namespace.
    pub fn to(address: &str) -> io::Result<Notifier> {
        let to = if let Some(name) = address.strip_prefix('@') {
            SocketAddr::from_abstract_name(name.as_bytes())?
        } else if address.starts_with('/') {
            SocketAddr::from_pathname(address)?
        } else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("notify socket {address:?}: only a path or an @abstract name is supported"),
            ));
        };
        let socket = UnixDatagram::unbound()?;
        socket.set_nonblocking(true)?;
        Ok(Notifier {
            socket,
            to,
            named: address.to_string(),
        })
    }

    /// Sends `state` (`KEY=VALUE` lines) as one datagram.
    pub fn send(&self, state: &str) -> io::Result<()> {
        let sent = self.socket.send_to_addr(state.as_bytes(), &self.to)?;
        if sent != state.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("{sent} of {} bytes sent", state.len()),
            ));
        }
        Ok(())
    }

    /// `READY=1` with a status line: the service serves.
    pub fn ready(&self, status: &str) -> io::Result<()> {
        self.send(&format!("READY=1\nSTATUS={}", one_line(status)))
    }

    /// A new status line alone.
    pub fn status(&self, status: &str) -> io::Result<()> {
        self.send(&format!("STATUS={}", one_line(status)))
    }

    /// `RELOADING=1`, stamped with the monotonic clock as systemd asks (it matches the
    /// `READY=1` that ends the reload).
    pub fn reloading(&self) -> io::Result<()> {
        self.send(&format!(
            "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=reloading",
            monotonic_us()
        ))
    }

    /// `STOPPING=1`: the service is on its way out.
    pub fn stopping(&self, status: &str) -> io::Result<()> {
        self.send(&format!("STOPPING=1\nSTATUS={}", one_line(status)))
    }

    /// The address as given (`@name` or a path), for a log line.
    pub fn address(&self) -> &str {
        &self.named
    }
}

/// A status is one line (a newline would start another `KEY=`).
fn one_line(status: &str) -> String {
    status.replace(['\n', '\r'], " ")
}

/// CLOCK_MONOTONIC in microseconds, the clock systemd compares `MONOTONIC_USEC` with.
fn monotonic_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the struct we pass; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn received(socket: &UnixDatagram) -> String {
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 4096];
        let n = socket.recv(&mut buf).expect("a datagram");
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn an_abstract_socket_is_told_ready_with_a_status_of_one_line() {
        let name = format!("hongbao-notify-test-{}", std::process::id());
        let listener =
            UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
                .unwrap();
        let notifier = Notifier::to(&format!("@{name}")).unwrap();
        notifier.ready("serving\nlisten=127.0.0.1:7000").unwrap();
        assert_eq!(
            received(&listener),
            "READY=1\nSTATUS=serving listen=127.0.0.1:7000"
        );
        notifier.stopping("stopping").unwrap();
        assert_eq!(received(&listener), "STOPPING=1\nSTATUS=stopping");
        notifier.reloading().unwrap();
        let reloading = received(&listener);
        assert!(
            reloading.starts_with("RELOADING=1\nMONOTONIC_USEC="),
            "{reloading}"
        );
        let us: u64 = reloading.lines().nth(1).unwrap()[15..].parse().unwrap();
        assert!(us > 0 && us <= monotonic_us());
    }

    #[test]
    fn a_path_socket_is_told_too() {
        let dir = std::env::temp_dir().join(format!("hongbao-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let _ = std::fs::remove_file(&path);
        let listener = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier::to(path.to_str().unwrap()).unwrap();
        assert_eq!(notifier.address(), path.to_str().unwrap());
        notifier.status("hello").unwrap();
        assert_eq!(received(&listener), "STATUS=hello");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn other_addresses_are_refused_and_nobody_listening_is_an_error() {
        let refused = Notifier::to("vsock:2:1234").unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::Unsupported);
        assert!(Notifier::to("relative/path").is_err());
        let nobody = Notifier::to("@hongbao-notify-nobody-listens-here").unwrap();
        assert!(nobody.ready("serving").is_err());
    }
}
