//! A TCP proxy in front of a service, which a test can cut and restore: the
//! service stays up for everyone else while the processes connected through the
//! proxy find it unreachable (their connections closed, new ones refused).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running proxy; it stops when dropped.
pub struct TcpProxy {
    addr: SocketAddr,
    open: Arc<AtomicBool>,
    /// Bumped by every cut: each forwarded connection watches it and closes.
    cuts: watch::Sender<u64>,
    /// Connections forwarded so far.
    forwarded: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for TcpProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpProxy")
            .field("addr", &self.addr)
            .field("open", &self.open.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards every connection to `target`
    /// (`host:port`).
    ///
    /// # Errors
    /// The listener cannot be bound.
    pub async fn start(target: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let open = Arc::new(AtomicBool::new(true));
        let (cuts, _) = watch::channel(0_u64);
        let forwarded = Arc::new(AtomicU64::new(0));
        let task = {
            let (open, cuts, forwarded) = (Arc::clone(&open), cuts.clone(), Arc::clone(&forwarded));
            let target = target.to_owned();
            tokio::spawn(async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    if !open.load(Ordering::SeqCst) {
                        // Refused: closed before a byte is exchanged.
                        drop(client);
                        continue;
                    }
                    forwarded.fetch_add(1, Ordering::Relaxed);
                    let mut cut = cuts.subscribe();
                    let target = target.clone();
                    tokio::spawn(async move {
                        let Ok(mut server) = TcpStream::connect(&target).await else {
                            return;
                        };
                        let mut client = client;
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            _ = cut.changed() => {}
                        }
                    });
                }
            })
        };
        Ok(Self {
            addr,
            open,
            cuts,
            forwarded,
            task,
        })
    }

    /// Where clients connect.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `url` (a `scheme://user@host:port/...` URL of the target) with its host and
    /// port replaced by the proxy's.
    #[must_use]
    pub fn url_for(&self, url: &str) -> String {
        with_host(url, self.addr)
    }

    /// Closes every forwarded connection and refuses new ones until [`TcpProxy::restore`].
    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Forwards new connections again.
    pub fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }

    /// Connections forwarded so far.
    #[must_use]
    pub fn forwarded(&self) -> u64 {
        self.forwarded.load(Ordering::Relaxed)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

/// The `host:port` of a `scheme://[user@]host:port/...` URL, for
/// [`TcpProxy::start`].
#[must_use]
pub fn host_port(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let end = host.find(['/', '?']).unwrap_or(host.len());
    Some(&host[..end]).filter(|h| !h.is_empty())
}

/// `url` with its `host:port` replaced by `addr` (user info, path and query kept).
fn with_host(url: &str, addr: SocketAddr) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (userinfo, hostpart) = match rest.split_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, rest),
    };
    let tail = hostpart.find(['/', '?']).map_or("", |i| &hostpart[i..]);
    match userinfo {
        Some(u) => format!("{scheme}://{u}@{addr}{tail}"),
        None => format!("{scheme}://{addr}{tail}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_point_at_the_proxy() {
        let a: SocketAddr = "127.0.0.1:40000".parse().expect("addr");
        assert_eq!(
            with_host("postgres://postgres@127.0.0.1:5432/test?x=1", a),
            "postgres://postgres@127.0.0.1:40000/test?x=1"
        );
        assert_eq!(
            with_host("redis://127.0.0.1:6379/", a),
            "redis://127.0.0.1:40000/"
        );
        assert_eq!(with_host("postgres://h:1", a), "postgres://127.0.0.1:40000");
        assert_eq!(
            host_port("postgres://postgres@127.0.0.1:5432/test?x=1"),
            Some("127.0.0.1:5432")
        );
        assert_eq!(host_port("redis://127.0.0.1:6379/"), Some("127.0.0.1:6379"));
        assert_eq!(host_port("not a url"), None);
    }
}
