//! inetd mode: one connection on stdin/stdout, served by the same
//! per-connection code as the listener ([`serve_connection`]), and the
//! process ends when the peer is done.
//!
//! inetd, xinetd and systemd (`Accept=yes`) hand over an accepted socket as
//! descriptors 0 and 1 (and often 2). A socket is served as one
//! bidirectional stream, with its addresses for logs and Via; anything else
//! (two pipes, a terminal) as stdin for reading and stdout for writing.
//! No unsafe code: descriptor 0 is duplicated through `as_fd`.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::sync::Arc;

use tracing::Instrument;

use crate::http::server::{ConnectionLimits, Handler, serve_connection};

/// What the process was given on descriptor 0.
pub enum Stdio {
    /// A stream socket (TCP from inetd, or a Unix socketpair).
    Socket {
        /// A duplicate of descriptor 0.
        socket: std::net::TcpStream,
        /// Our address, when it is an Internet socket.
        local: Option<SocketAddr>,
        /// The peer's address, when it is an Internet socket.
        peer: Option<SocketAddr>,
    },
    /// Not a socket: read stdin, write stdout.
    Pipes,
}

impl Stdio {
    /// Looks at descriptor 0.
    ///
    /// # Errors
    /// When descriptor 0 is closed or cannot be duplicated.
    pub fn take() -> io::Result<Stdio> {
        let fd: OwnedFd = io::stdin().as_fd().try_clone_to_owned()?;
        let is_socket = std::fs::File::from(fd.try_clone()?)
            .metadata()?
            .file_type()
            .is_socket();
        if !is_socket {
            return Ok(Stdio::Pipes);
        }
        // A stream socket of any family reads and writes as TCP does; only
        // the address calls need an Internet one.
        let socket = std::net::TcpStream::from(fd);
        Ok(Stdio::Socket {
            local: socket.local_addr().ok(),
            peer: socket.peer_addr().ok(),
            socket,
        })
    }

    /// Our address, if descriptor 0 is an Internet socket.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match self {
            Stdio::Socket { local, .. } => *local,
            Stdio::Pipes => None,
        }
    }
}

/// Serves the one connection of `stdio` until the peer is done.
///
/// # Errors
/// When the socket cannot be registered with the runtime.
pub async fn serve_stdio<H: Handler>(
    stdio: Stdio,
    handler: Arc<H>,
    limits: ConnectionLimits,
) -> io::Result<()> {
    match stdio {
        Stdio::Socket { socket, peer, .. } => {
            socket.set_nonblocking(true)?;
            let stream = tokio::net::TcpStream::from_std(socket)?;
            let _ = stream.set_nodelay(true);
            let name = peer.map_or_else(|| "local socket".to_owned(), |p| p.to_string());
            serve_connection(stream, peer, handler, limits)
                .instrument(tracing::info_span!("conn", peer = %name, inetd = true))
                .await;
        }
        Stdio::Pipes => {
            let io = tokio::io::join(tokio::io::stdin(), tokio::io::stdout());
            serve_connection(io, None, handler, limits)
                .instrument(tracing::info_span!("conn", peer = "stdio", inetd = true))
                .await;
        }
    }
    Ok(())
}

/// Whether descriptor 2 is the connection itself, as inetd hands it over:
/// a log line there would land in the HTTP stream. (A journald socket on
/// descriptor 2, as systemd gives, is another socket and fine to log to.)
pub fn stderr_is_the_connection() -> bool {
    use std::os::unix::fs::MetadataExt;
    let identity = |fd: std::os::fd::BorrowedFd<'_>| {
        fd.try_clone_to_owned()
            .and_then(|fd| std::fs::File::from(fd).metadata())
            .ok()
            .filter(|m| m.file_type().is_socket())
            .map(|m| (m.dev(), m.ino()))
    };
    let stdin = identity(io::stdin().as_fd());
    stdin.is_some() && stdin == identity(io::stderr().as_fd())
}
