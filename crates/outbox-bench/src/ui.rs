//! `ui_*`: the dashboard's overview and its messages page filtered to `sent`,
//! served on loopback as `outbox run` serves them, each timed as a whole HTTP
//! request.

use std::time::Instant;

use anyhow::Context as _;

/// One HTTP/1.1 GET on a fresh loopback connection: (status, head, body).
fn http_get(
    address: std::net::SocketAddr,
    path: &str,
    cookie: Option<&str>,
) -> anyhow::Result<(u16, String, String)> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address)?;
    let cookie = cookie.map_or(String::new(), |c| format!("Cookie: {c}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\n{cookie}Connection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, head.to_owned(), body.to_owned()))
}

/// The dashboard over `service`, served on loopback as `outbox run` serves it:
/// median of 7 of the overview and of the messages page filtered to `sent`, each
/// a whole HTTP request (session check, service calls, rendering).
pub(crate) async fn ui_times(service: outbox_admin::AdminService) -> anyhow::Result<(f64, f64)> {
    // getrandom's error is a std::error::Error only with its `std` feature, which
    // nothing in this package's graph turns on: take its message.
    let secret = outbox_admin::random_secret(16).map_err(anyhow::Error::msg)?;
    let options = outbox_admin::UiOptions {
        one_time_login: Some(outbox_admin::OneTimeLogin {
            secret: outbox_admin::Secret::new(secret.clone()),
            name: "bench".into(),
            role: outbox_admin::Role::Read,
        }),
        ..outbox_admin::UiOptions::default()
    };
    let app = axum::Router::new().nest(
        "/ui",
        outbox_admin::ui_router(service, outbox_admin::AdminAuth::default(), options),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let times = tokio::task::spawn_blocking(move || -> anyhow::Result<(f64, f64)> {
        let (status, head, _) = http_get(address, &format!("/ui/login?token={secret}"), None)?;
        anyhow::ensure!(status == 303, "dashboard login: {head}");
        // The session cookie, named after the port when the request named one.
        let (name, value) = head
            .lines()
            .filter_map(|l| l.strip_prefix("set-cookie: "))
            .filter(|l| l.starts_with("outbox_session"))
            .find_map(|l| l.split(';').next()?.split_once('='))
            .context("no session cookie")?;
        let cookie = format!("{name}={value}");
        let time = |path: &str, expect: &str| -> anyhow::Result<f64> {
            let mut ms = Vec::new();
            for _ in 0..7 {
                let t = Instant::now();
                let (status, _, body) = http_get(address, path, Some(&cookie))?;
                ms.push(t.elapsed().as_secs_f64() * 1000.0);
                anyhow::ensure!(status == 200 && body.contains(expect), "{path}: {status}");
            }
            ms.sort_by(f64::total_cmp);
            Ok(ms[ms.len() / 2])
        };
        Ok((
            time("/ui", "id=\"count-pending\"")?,
            time("/ui/messages?status=sent", "data-status=\"sent\"")?,
        ))
    })
    .await??;
    server.abort();
    Ok(times)
}
