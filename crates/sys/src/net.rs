//! Socket helpers shared by the gateway workers, the supervisor and the load clients:
//! SO_REUSEPORT listeners, receive timestamps, non-blocking writes, abstract Unix
//! addresses, and loopback in a new network namespace.

use std::io::{ErrorKind, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

use crate::clock::UnixTime;

/// A Linux abstract-namespace Unix address (no file to clean up, no path length worry).
pub fn abstract_addr(name: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
    std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
}

/// A TCP socket bound to `addr` with SO_REUSEPORT, so that every worker can hold its own
/// listening socket on the same port and the kernel spreads connections over them. With
/// `listen == false` the socket only reserves the port (the supervisor's placeholder).
pub fn reuseport_listener(
    addr: SocketAddr,
    listen: bool,
) -> std::io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    if listen {
        socket.listen(65535)?;
    }
    Ok(socket.into())
}

/// Sets how many connections the kernel queues for a listening socket before it drops
/// SYNs (listen(2) again on a listening socket changes only its backlog; the kernel caps
/// it at `net.core.somaxconn`). Connections already queued stay.
pub fn set_listen_backlog(socket: &impl AsRawFd, backlog: u32) -> std::io::Result<()> {
    let backlog = backlog.min(i32::MAX as u32) as i32;
    // SAFETY: listen(2) on a descriptor we hold; it touches no memory of ours.
    match unsafe { libc::listen(socket.as_raw_fd(), backlog) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Whether `addr` (`IP:PORT`) is a loopback address, 127.0.0.0/8 or ::1: reachable from
/// this machine only. A name (`localhost:7000`) or anything else unparsed is not: only an
/// address says for sure where a socket listens.
pub fn is_loopback_address(addr: &str) -> bool {
    addr.parse::<SocketAddr>()
        .is_ok_and(|a| a.ip().is_loopback())
}

/// The PROXY protocol's version-1 header (HAProxy's text form, what nginx's stream
/// module sends with `proxy_protocol on`) at the front of `buf`: the client's address and
/// the header's length; `Ok(None)` when the line is not whole yet; an error when it is not
/// one. `PROXY UNKNOWN` names no address (`None` in the first place).
pub fn proxy_header(buf: &[u8]) -> Result<Option<(Option<IpAddr>, usize)>, &'static str> {
    /// The longest a version-1 header may be, its CRLF included.
    const MAX: usize = 107;
    const PREFIX: &[u8] = b"PROXY ";
    let seen = buf.len().min(PREFIX.len());
    if buf[..seen] != PREFIX[..seen] {
        return Err("not a PROXY protocol header");
    }
    let Some(end) = buf.windows(2).take(MAX).position(|w| w == b"\r\n") else {
        return if buf.len() >= MAX {
            Err("a PROXY header over 107 bytes")
        } else {
            Ok(None)
        };
    };
    let line =
        std::str::from_utf8(&buf[PREFIX.len()..end]).map_err(|_| "a PROXY header not ASCII")?;
    let fields: Vec<&str> = line.split(' ').collect();
    let client = match fields.as_slice() {
        ["UNKNOWN", ..] => None,
        ["TCP4" | "TCP6", source, _dest, _sport, _dport] => Some(
            source
                .parse::<IpAddr>()
                .map_err(|_| "a PROXY header's source is not an address")?,
        ),
        _ => return Err("a PROXY header of an unknown form"),
    };
    Ok(Some((client, end + 2)))
}

/// Whether no process listens on `addr` now. SO_REUSEPORT lets any process of the same
/// user join a listening port, and the kernel then splits connections between them
/// without a word: a server makes sure the port is free (a bind without SO_REUSEPORT
/// fails where anyone listens) before it makes its own group. The error names the
/// process that holds it, when /proc tells.
pub fn ensure_free(addr: SocketAddr) -> std::io::Result<()> {
    if addr.port() == 0 {
        return Ok(());
    }
    let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    probe.set_reuse_address(true)?;
    match probe.bind(&addr.into()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AddrInUse => {
            let who = holder(addr)
                .map(|(pid, name)| format!(" by process {pid} ({name})"))
                .unwrap_or_default();
            Err(std::io::Error::new(
                ErrorKind::AddrInUse,
                format!("{addr} is in use{who}: another server listens there"),
            ))
        }
        Err(e) => Err(e),
    }
}

/// The process (id, name) holding a listening socket on `addr`, from /proc/net/tcp{,6}
/// and the processes' descriptors (those of other users are not readable: `None`).
fn holder(addr: SocketAddr) -> Option<(u32, String)> {
    let table = if addr.is_ipv4() {
        "/proc/net/tcp"
    } else {
        "/proc/net/tcp6"
    };
    let port = format!(":{:04X}", addr.port());
    let inode = std::fs::read_to_string(table)
        .ok()?
        .lines()
        .skip(1)
        .find_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address "0100007F:1B58", state 0A = LISTEN, inode field 9.
            (f.len() > 9 && f[1].ends_with(&port) && f[3] == "0A").then(|| f[9].to_string())
        })?;
    let target = format!("socket:[{inode}]");
    for proc_dir in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = proc_dir.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(proc_dir.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == target) {
                // Its command line's first words (a worker's comm is "exe").
                let cmdline = std::fs::read(proc_dir.path().join("cmdline")).unwrap_or_default();
                let words: Vec<String> = cmdline
                    .split(|&b| b == 0)
                    .filter(|w| !w.is_empty())
                    .take(2)
                    .map(|w| String::from_utf8_lossy(w).into_owned())
                    .collect();
                return Some((pid, words.join(" ")));
            }
        }
    }
    None
}

/// Turns on receive timestamps (SO_TIMESTAMPNS) for a connection, or for the connections
/// a listener accepts from now on (those whose handshake finishes later), so
/// `read_stamped` can tell how long their bytes waited. It costs a clock read per packet
/// machine-wide once any socket asks, so only when shedding is on.
pub fn enable_receive_timestamps(socket: &impl AsRawFd) -> std::io::Result<()> {
    set_int_option(socket, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)
}

fn set_int_option(socket: &impl AsRawFd, level: i32, name: i32, value: i32) -> std::io::Result<()> {
    // SAFETY: setsockopt reads an int from a valid pointer for the given length.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            &value as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Reads like `read(2)`, and also returns when the kernel received the newest of the
/// bytes read (SO_TIMESTAMPNS; the wall clock, as time since the Unix epoch) when the
/// socket has receive timestamps on.
pub fn read_stamped(fd: RawFd, buf: &mut [u8]) -> std::io::Result<(usize, Option<UnixTime>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; every pointer in it refers to a live local buffer of
    // the stated length, and the cmsg walk stays inside `control` as the kernel filled it.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = std::mem::size_of_val(&control);
        let n = libc::recvmsg(fd, &mut msg, 0);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut stamp = None;
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_TIMESTAMPNS
            {
                let ts = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const libc::timespec);
                stamp = Some(UnixTime::from_duration(Duration::new(
                    ts.tv_sec as u64,
                    ts.tv_nsec as u32,
                )));
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        Ok((n as usize, stamp))
    }
}

/// Whether a socket has bytes waiting to be read (peeks one without taking it).
pub fn has_input(fd: RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: recv writes at most one byte into a live local.
    let n = unsafe {
        libc::recv(
            fd,
            &mut byte as *mut u8 as *mut libc::c_void,
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n > 0
}

/// Writes as much of `bytes` as a non-blocking socket takes now and returns how much that
/// was (0..=len); stops at `WouldBlock`. An error means the peer is gone.
pub fn write_nonblocking(w: &mut impl Write, bytes: &[u8]) -> std::io::Result<usize> {
    let mut written = 0;
    while written < bytes.len() {
        match w.write(&bytes[written..]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}

/// Sets `lo` up in this network namespace (a new namespace starts with it down).
pub fn bring_loopback_up() -> std::io::Result<()> {
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, None)?;
    // SAFETY: ifreq is plain data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the ifreq we pass, and the flags
    // member of its union is the one they use.
    unsafe {
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_headers_name_the_client() {
        let line = b"PROXY TCP4 203.0.113.7 127.0.0.1 51234 7000\r\nrest";
        assert_eq!(
            proxy_header(line),
            Ok(Some((Some("203.0.113.7".parse().unwrap()), line.len() - 4)))
        );
        let v6 = b"PROXY TCP6 2001:db8::1 ::1 1 2\r\n";
        assert_eq!(
            proxy_header(v6).unwrap().unwrap().0,
            Some("2001:db8::1".parse().unwrap())
        );
        assert_eq!(proxy_header(b"PROXY UNKNOWN\r\n"), Ok(Some((None, 15))));
        assert_eq!(proxy_header(b"PROXY TCP4 1.2"), Ok(None), "not whole yet");
        assert_eq!(proxy_header(b"PRO"), Ok(None));
        assert!(proxy_header(b"\0\0\0\x06\x02\x02").is_err(), "a frame");
        assert!(proxy_header(b"PROXY TCP4 nope 1.1.1.1 1 2\r\n").is_err());
        assert!(proxy_header(&[b'P'; 200]).is_err());
        let long = [b"PROXY ".as_slice(), &[b'1'; 150]].concat();
        assert!(proxy_header(&long).is_err());
    }

    #[test]
    fn loopback_is_127_slash_8_and_v6_one_only() {
        for yes in ["127.0.0.1:7000", "127.9.8.7:0", "[::1]:80"] {
            assert!(is_loopback_address(yes), "{yes}");
        }
        for no in [
            "0.0.0.0:7000",
            "10.0.0.1:1",
            "[::]:80",
            "localhost:7000",
            "",
            "x",
        ] {
            assert!(!is_loopback_address(no), "{no}");
        }
    }

    /// Connections accepted from a listener with timestamps on carry them: a read tells how
    /// long its bytes waited, which is what shedding late shakes relies on.
    #[test]
    fn an_accepted_connection_reads_with_the_kernel_arrival_time() {
        let listener = reuseport_listener("127.0.0.1:0".parse().unwrap(), true).unwrap();
        enable_receive_timestamps(&listener).unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let (server, _) = listener.accept().unwrap();
        client.write_all(b"hello").unwrap();
        std::thread::sleep(Duration::from_millis(60));
        let mut buf = [0u8; 16];
        assert!(has_input(server.as_raw_fd()));
        let (n, stamp) = read_stamped(server.as_raw_fd(), &mut buf).unwrap();
        assert!(!has_input(server.as_raw_fd()));
        let now = UnixTime::now();
        assert_eq!(&buf[..n], b"hello");
        let waited = now.since(stamp.expect("a receive timestamp"));
        assert!(
            waited >= Duration::from_millis(55) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
    }
}
