//! `outbox demo --serve`: after the flow, the demo's in-memory stores stay up, its
//! relay and consumer keep running (what is requeued is published and handled
//! again), and the dashboard serves them on loopback. One line on stdout gives the login URL,
//! which carries a one-time secret (as notebook servers do): it opens one write
//! session, named `demo` in the audit log, and is spent.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use outbox_adapters_memory::MemoryAuditLog;
use outbox_admin::{
    AdminAuth, AdminPorts, AdminService, OneTimeLogin, Role, Secret, UiOptions, ui_router,
};
use tokio_util::sync::CancellationToken;

use crate::admin_api::{ADMIN_API_PATH, UI_PATH};
use crate::demo::DemoWorld;

/// The admin service over the demo's stores (sweep reports and locks included).
#[must_use]
pub fn demo_service(world: &DemoWorld) -> AdminService {
    let audit = Arc::new(MemoryAuditLog::new(Arc::clone(&world.clock)));
    AdminService::new(AdminPorts {
        outbox: world.outbox.clone(),
        inbox: world.inbox.clone(),
        audit,
        outbox_store: world.outbox.clone(),
        pauses: Arc::new(world.outbox.pauses()),
    })
    .with_sweep_reports(world.state.clone(), world.sweep_keys.clone())
    .with_locks(world.lock.clone(), world.lock_keys.clone())
    .with_throughput(world.throughput.clone())
    .with_clock(Arc::clone(&world.clock))
}

/// The dashboard at [`UI_PATH`] (and the JSON API at [`ADMIN_API_PATH`], closed:
/// the demo configures no token) over `world`, opened once by `secret`.
pub fn demo_app(
    world: &DemoWorld,
    secret: &str,
    renewal: Option<outbox_admin::OneTimeRenewal>,
    shutdown: Option<tokio::sync::watch::Receiver<bool>>,
) -> axum::Router {
    let service = demo_service(world);
    let options = UiOptions {
        shutdown,
        base: UI_PATH.to_owned(),
        one_time_login: Some(demo_login(secret)),
        one_time_renewal: renewal,
        ..UiOptions::default()
    };
    axum::Router::new()
        .nest(
            UI_PATH,
            ui_router(service.clone(), AdminAuth::default(), options),
        )
        .nest(
            ADMIN_API_PATH,
            outbox_admin::router(service, AdminAuth::default()),
        )
}

/// The demo's one-time login: `secret` signs in once as `demo`, who may act.
fn demo_login(secret: &str) -> OneTimeLogin {
    OneTimeLogin {
        secret: Secret::new(secret),
        name: "demo".to_owned(),
        role: Role::Write,
    }
}

/// After each one-time login used, a fresh one, its URL (under `site`, known
/// once the port is bound) printed on stdout as the first was: a second browser,
/// or a sign-in after logout, is not met by a closed dashboard.
fn renewal(site: Arc<std::sync::OnceLock<String>>) -> outbox_admin::OneTimeRenewal {
    outbox_admin::OneTimeRenewal {
        hint: "the terminal running `outbox demo --serve` has printed a fresh login link".into(),
        next: Arc::new(move || {
            let secret = outbox_admin::random_secret(24).ok()?;
            let site = site.get()?;
            #[allow(clippy::print_stdout)] // the demo's output, as its first login line
            {
                println!("dashboard: a fresh one-time login: {site}{UI_PATH}/login?token={secret}");
            }
            Some(demo_login(&secret))
        }),
    }
}

/// Serves the dashboard over `world` on `address` (loopback only) until `cancel`
/// fires; `announce` gets the login URL once the port is bound.
///
/// # Errors
/// A non-loopback address, an address that cannot be bound, no randomness.
pub async fn serve(
    world: &DemoWorld,
    address: SocketAddr,
    announce: impl FnOnce(&str),
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        address.ip().is_loopback(),
        "--serve-address must be a loopback address (the demo's dashboard has a one-time login only), got {address}"
    );
    let secret = outbox_admin::random_secret(24).context("no randomness for the login secret")?;
    // The overview's live streams end with the server (Ctrl-C).
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            cancel.cancelled().await;
            let _ = stop.send(true);
        });
    }
    let site = Arc::new(std::sync::OnceLock::new());
    let app = demo_app(
        world,
        &secret,
        Some(renewal(Arc::clone(&site))),
        Some(shutdown),
    );
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot serve the dashboard on {address}"))?;
    let bound = listener.local_addr()?;
    let _ = site.set(format!("http://{bound}"));
    announce(&format!("http://{bound}{UI_PATH}/login?token={secret}"));
    axum::serve(listener, app)
        .with_graceful_shutdown(cancel.cancelled_owned())
        .await
        .context("dashboard server failed")
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};

    use super::*;
    use crate::demo::{DemoOptions, run_keeping};

    /// One HTTP/1.1 request on a fresh connection: (status, head, body).
    fn request(address: &str, path: &str, cookie: Option<&str>) -> (u16, String, String) {
        let mut stream = std::net::TcpStream::connect(address).expect("connect");
        let cookie = cookie.map_or(String::new(), |c| format!("Cookie: {c}\r\n"));
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {address}\r\n{cookie}Connection: close\r\n\r\n"
        )
        .expect("write");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("read");
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, head.to_owned(), body.to_owned())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_demo_serves_its_stores_behind_a_one_time_login() {
        let opts = DemoOptions {
            messages: 30,
            poison: 3,
            publish_failures: 0,
            nacks: 0,
            returns: 0,
            redeliveries: 0,
            handler_failure_rate: 0.0,
            progress: false,
            ..DemoOptions::default()
        };
        let (summary, world, flow) = run_keeping(&opts).await.expect("demo");
        assert_eq!(summary.dead, 3);
        // The relay and the consumer still run: a message written now is
        // published and handled, as a requeued one would be.
        let late = outbox_core::NewMessage::new("demo.orders", "order.created", b"{}".to_vec())
            .with_type("order.created")
            .into_message(
                outbox_core::MessageId::from_uuid(uuid::Uuid::now_v7()),
                world.clock.now(),
            );
        outbox_ports::OutboxStore::enqueue(&*world.outbox, vec![late.clone()])
            .await
            .expect("enqueue");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let handled =
                outbox_ports::InboxOperator::get_delivery(&*world.inbox, "demo-billing", late.id)
                    .await
                    .expect("read")
                    .map(|r| r.status);
            if handled == Some(outbox_core::InboxStatus::Consumed) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "a message written after the flow settled was never consumed: {handled:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }

        let refused = serve(
            &world,
            "0.0.0.0:0".parse().expect("address"),
            |_| {},
            CancellationToken::new(),
        )
        .await;
        let e = refused.expect_err("not on loopback");
        assert!(e.to_string().contains("loopback"), "{e}");

        let cancel = CancellationToken::new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let server = tokio::spawn({
            let cancel = cancel.clone();
            async move {
                serve(
                    &world,
                    "127.0.0.1:0".parse().expect("address"),
                    move |url| {
                        let _ = tx.send(url.to_owned());
                    },
                    cancel,
                )
                .await
            }
        });
        let url = rx.await.expect("announced");
        let rest = url.strip_prefix("http://").expect("http URL");
        let (address, path) = rest.split_at(rest.find('/').expect("path"));
        assert!(
            path.starts_with("/ui/login?token=") && path.len() > 40,
            "{url}"
        );
        let (address, path) = (address.to_owned(), path.to_owned());
        tokio::task::spawn_blocking(move || {
            let (status, head, _) = request(&address, &path, None);
            assert_eq!(status, 303, "{head}");
            // Named after the port (two dashboards on one host keep theirs).
            let port = address.rsplit(':').next().expect("a port");
            let name = format!("outbox_session_{port}=");
            let cookie = head
                .lines()
                .find_map(|l| l.strip_prefix("set-cookie: ")?.strip_prefix(name.as_str()))
                .and_then(|v| v.split(';').next())
                .expect("a session cookie");
            let cookie = format!("{name}{cookie}");
            let (status, _, body) = request(&address, "/ui", Some(&cookie));
            assert_eq!(status, 200);
            assert!(body.contains("data-consumer=\"demo-billing\""), "{body}");
            assert!(
                body.contains("<td class=\"num\" data-count=\"dead\">3</td>"),
                "{body}"
            );
            let (status, _, body) = request(
                &address,
                "/ui/consumers/demo-billing?status=dead",
                Some(&cookie),
            );
            assert_eq!(status, 200);
            assert_eq!(
                body.matches("<tr data-id=").count(),
                3,
                "three dead rows: {body}"
            );
            let (again, _, body) = request(&address, &path, None);
            assert_eq!(again, 401, "the login URL works once");
            assert!(
                body.contains("has printed a fresh login link"),
                "says where the next login is: {body}"
            );
            let (_, _, form) = request(&address, "/ui/login", None);
            assert!(
                !form.contains("login-closed"),
                "a fresh one-time login keeps the dashboard open: {form}"
            );
            let (api, _, _) = request(&address, "/api/v1/stats", None);
            assert_eq!(api, 403, "the API stays closed: no token configured");
        })
        .await
        .expect("requests");
        cancel.cancel();
        server.await.expect("joined").expect("served");
        flow.stop().await.expect("the flow stops");
    }
}
