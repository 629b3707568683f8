//! Descriptors passed between processes over a Unix stream (SCM_RIGHTS), and who is on
//! the other end of one (SO_PEERCRED): how a server being upgraded hands its listening
//! sockets, its admin socket and its data directory's lock to the binary replacing it.
//!
//! The descriptors ride on one message's first byte; the receiver gets them close-on-exec
//! (`MSG_CMSG_CLOEXEC`) and owns them.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The most descriptors one message carries (a handover: three listening addresses for
/// up to a few hundred workers, the admin socket and a lock).
pub const MAX_FDS: usize = 1024;

/// Sends `bytes` with `fds` attached to its first byte. Blocks until the whole of
/// `bytes` is written on a blocking socket; on a non-blocking one a short write is an
/// error (the message is meant to go whole, and is small).
pub fn send_with_fds(socket: &impl AsRawFd, bytes: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    if bytes.is_empty() || fds.len() > MAX_FDS {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "descriptors ride on at least one byte, and at most MAX_FDS of them",
        ));
    }
    let payload = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE is arithmetic on a length.
    let space = unsafe { libc::CMSG_SPACE(payload as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: every pointer in the msghdr refers to a live local buffer of the stated
    // length; the one control message written is inside `control` (CMSG_SPACE sized it),
    // and the descriptors are copied into it, not borrowed.
    let sent = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = space;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(payload as u32) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr() as *const u8,
                libc::CMSG_DATA(cmsg),
                payload,
            );
        }
        libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut at = sent as usize;
    if at < bytes.len() {
        // The descriptors went with the first byte; the rest is plain.
        let mut stream = std::mem::ManuallyDrop::new(
            // SAFETY: a borrowed view of the caller's socket, never closed here.
            unsafe { std::os::unix::net::UnixStream::from_raw_fd(socket.as_raw_fd()) },
        );
        use std::io::Write;
        stream.write_all(&bytes[at..])?;
        at = bytes.len();
    }
    debug_assert_eq!(at, bytes.len());
    Ok(())
}

/// Reads up to `buf.len()` bytes like `read(2)`, and takes ownership of any descriptors
/// that came with them (close-on-exec). A message whose descriptors did not all fit is
/// an error (they were closed by the kernel: nothing half-received is used).
pub fn recv_with_fds(
    socket: &impl AsRawFd,
    buf: &mut [u8],
) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    // SAFETY: CMSG_SPACE is arithmetic on a length.
    let space =
        unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut fds = Vec::new();
    // SAFETY: msghdr is plain data; every pointer in it refers to a live local buffer of
    // the stated length, and the cmsg walk stays inside `control` as the kernel filled
    // it. Each descriptor read out of SCM_RIGHTS is new in this process and owned by no
    // one else, so wrapping it in an OwnedFd is sound.
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space;
        let n = libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let header = libc::CMSG_LEN(0) as usize;
                let count = ((*cmsg).cmsg_len as usize - header) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    let fd = std::ptr::read_unaligned((data as *const RawFd).add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "more descriptors came than fit: refused",
            ));
        }
        n as usize
    };
    Ok((n, fds))
}

/// The user id of the process on the other end of a Unix stream (SO_PEERCRED, as it was
/// when it connected).
pub fn peer_uid(socket: &impl AsRawFd) -> std::io::Result<u32> {
    // SAFETY: getsockopt writes at most `len` bytes into a live local ucred.
    unsafe {
        let mut cred: libc::ucred = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        let r = libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        );
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(cred.uid)
    }
}

/// This process's effective user id.
pub fn my_uid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    #[test]
    fn a_listening_socket_passed_over_accepts_in_the_receiver() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        send_with_fds(&a, b"listeners", &[listener.as_raw_fd()]).unwrap();
        drop(listener); // ours closed: the socket lives on in what was passed
        let mut buf = [0u8; 64];
        let (n, mut fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"listeners");
        assert_eq!(fds.len(), 1);
        let passed = std::net::TcpListener::from(fds.remove(0));
        let mut client = std::net::TcpStream::connect(addr).unwrap();
        let (mut served, _) = passed.accept().unwrap();
        client.write_all(b"hi").unwrap();
        let mut got = [0u8; 2];
        served.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi");
        // Received close-on-exec: an exec'd child does not inherit it by accident.
        // SAFETY: F_GETFD on a descriptor we own.
        let flags = unsafe { libc::fcntl(passed.as_fd().as_raw_fd(), libc::F_GETFD) };
        assert!(flags & libc::FD_CLOEXEC != 0);
    }

    #[test]
    fn the_peer_is_this_user() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(peer_uid(&a).unwrap(), my_uid());
    }

    #[test]
    fn bytes_without_descriptors_come_alone() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        send_with_fds(&a, b"x", &[]).unwrap();
        let mut buf = [0u8; 8];
        let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!((n, fds.len()), (1, 0));
    }
}
