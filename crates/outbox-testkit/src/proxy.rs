//! A TCP proxy in front of a service, which a test can cut and restore: the
//! service stays up for everyone else while the processes connected through the
//! proxy find it unreachable (their connections closed, new ones refused). It can
//! also stall (forward nothing, close nothing: a half-open network, as a partition
//! or a dead middlebox leaves it) and delay every byte each way.
//!
//! Written here rather than taken from a crate: Toxiproxy is a Go server with no
//! Debian package, and its Rust port `noxious` has had no release since 2021 (tokio-util
//! 0.6); what the suite needs is these three faults on loopback.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What forwarded connections do with the bytes they read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// Each chunk written `delay` after it was read.
    Forward { delay: Duration },
    /// Read and held, nothing written, nothing closed; written once forwarding
    /// resumes (as TCP delivers what it retransmitted when a partition heals).
    Stalled { delay: Duration },
}

impl Flow {
    fn delay(self) -> Duration {
        match self {
            Self::Forward { delay } | Self::Stalled { delay } => delay,
        }
    }
}

/// A running proxy; it stops when dropped.
pub struct TcpProxy {
    addr: SocketAddr,
    open: Arc<AtomicBool>,
    /// Bumped by every cut: each forwarded connection watches it and closes.
    cuts: watch::Sender<u64>,
    /// Connections forwarded so far.
    forwarded: Arc<AtomicU64>,
    flow: watch::Sender<Flow>,
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
        let (flow, _) = watch::channel(Flow::Forward {
            delay: Duration::ZERO,
        });
        let forwarded = Arc::new(AtomicU64::new(0));
        let task = {
            let (open, cuts, forwarded) = (Arc::clone(&open), cuts.clone(), Arc::clone(&forwarded));
            let flow = flow.clone();
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
                    let (up, down) = (flow.subscribe(), flow.subscribe());
                    tokio::spawn(async move {
                        let Ok(server) = TcpStream::connect(&target).await else {
                            return;
                        };
                        let (client_read, client_write) = client.into_split();
                        let (server_read, server_write) = server.into_split();
                        tokio::select! {
                            () = async {
                                tokio::join!(
                                    pump(client_read, server_write, up),
                                    pump(server_read, client_write, down)
                                );
                            } => {}
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
            flow,
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

    /// Stops forwarding bytes, either way, on every connection (new ones are
    /// accepted and get nothing either); nothing is closed. What is read meanwhile
    /// is held and written after [`TcpProxy::resume`].
    pub fn stall(&self) {
        self.flow.send_modify(|f| {
            *f = Flow::Stalled { delay: f.delay() };
        });
    }

    /// Forwards again after [`TcpProxy::stall`].
    pub fn resume(&self) {
        self.flow.send_modify(|f| {
            *f = Flow::Forward { delay: f.delay() };
        });
    }

    /// Delays every chunk by `delay` each way (a round trip gains twice that),
    /// from the next chunk read.
    pub fn delay(&self, delay: Duration) {
        self.flow.send_modify(|f| {
            *f = match *f {
                Flow::Forward { .. } => Flow::Forward { delay },
                Flow::Stalled { .. } => Flow::Stalled { delay },
            };
        });
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

/// Copies `from` to `to` one chunk at a time, each chunk written its delay after
/// it was read and not while the flow is stalled; the write half is shut down
/// once `from` ends and everything read is written.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, flow: watch::Receiver<Flow>) {
    let (chunks, mut pending) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read_flow = flow.clone();
    let read = async move {
        let mut buf = vec![0_u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let due = Instant::now() + read_flow.borrow().delay();
            if chunks.send((due, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let mut flow = flow;
    let write = async move {
        while let Some((due, chunk)) = pending.recv().await {
            tokio::time::sleep_until(due).await;
            if flow
                .wait_for(|f| matches!(f, Flow::Forward { .. }))
                .await
                .is_err()
            {
                break;
            }
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
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

    /// An echo server on loopback; its address.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(c: &mut TcpStream, within: Duration) -> Option<Duration> {
        let started = std::time::Instant::now();
        c.write_all(b"ping").await.expect("write");
        let mut got = [0_u8; 4];
        tokio::time::timeout(within, c.read_exact(&mut got))
            .await
            .ok()
            .map(|r| {
                r.expect("read");
                assert_eq!(&got, b"ping");
                started.elapsed()
            })
    }

    #[tokio::test]
    async fn a_delay_is_paid_each_way() {
        let proxy = TcpProxy::start(&echo().await.to_string())
            .await
            .expect("proxy");
        let mut c = TcpStream::connect(proxy.addr()).await.expect("connect");
        let fast = round_trip(&mut c, Duration::from_secs(5))
            .await
            .expect("echo");
        proxy.delay(Duration::from_millis(100));
        let slow = round_trip(&mut c, Duration::from_secs(5))
            .await
            .expect("echo");
        assert!(
            slow >= Duration::from_millis(200) && slow > fast,
            "a round trip through a 100 ms delay each way took {slow:?} (before: {fast:?})"
        );
    }

    #[tokio::test]
    async fn a_stall_forwards_nothing_closes_nothing_and_delivers_on_resume() {
        let proxy = TcpProxy::start(&echo().await.to_string())
            .await
            .expect("proxy");
        let mut c = TcpStream::connect(proxy.addr()).await.expect("connect");
        round_trip(&mut c, Duration::from_secs(5))
            .await
            .expect("echo before");
        proxy.stall();
        assert_eq!(
            round_trip(&mut c, Duration::from_millis(500)).await,
            None,
            "nothing comes back while stalled"
        );
        // A new connection is taken and gets nothing either.
        let mut fresh = TcpStream::connect(proxy.addr())
            .await
            .expect("connect while stalled");
        assert_eq!(
            round_trip(&mut fresh, Duration::from_millis(300)).await,
            None
        );
        proxy.resume();
        // What was held arrives: the earlier ping first, then this one.
        let mut held = [0_u8; 4];
        tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut held))
            .await
            .expect("the held bytes arrive")
            .expect("read");
        assert_eq!(&held, b"ping");
        round_trip(&mut c, Duration::from_secs(5))
            .await
            .expect("echo after");
    }

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
