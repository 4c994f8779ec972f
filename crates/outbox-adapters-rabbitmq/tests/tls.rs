//! TLS to RabbitMQ (`amqps://`, a CA file, a client certificate), against the local
//! broker with an extra TLS listener started at run time by the test itself
//! ([`RabbitTlsSetup`]: `rabbit_networking:start_ssl_listener/3` through
//! `rabbitmqctl eval`, on 127.0.0.1:5699; the broker is not restarted and its plain
//! listener and connections are untouched). The listener is stopped when each test
//! ends, also when it fails, and at the start of the next run if a run crashed. The
//! tests share that port, so they run one at a time.
//!
//! The server certificate names `IP:127.0.0.1` only; `localhost` is the wrong host
//! name.

mod common;

use std::time::Duration;

use outbox_adapters_rabbitmq::{
    QueueSpec, RabbitPublisher, RabbitPublisherConfig, RabbitTls, connect_with_tls,
};
use outbox_core::{MessageId, NewMessage, Timestamp};
use outbox_ports::{PublishOutcome, Publisher};
use outbox_testkit::services::{AMQP_ADDR, TestUrls, is_local};
use outbox_testkit::tls::{RABBIT_TLS_PORT, RabbitTlsSetup, TestPki, in_ci};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The PKI and the listener, or `None` outside CI when they cannot be made (the
/// test says why). In CI they must be made.
fn tls(require_client_cert: bool) -> Option<(TestPki, RabbitTlsSetup)> {
    let url = TestUrls::from_env().amqp;
    let made = (|| {
        if !is_local(&url, AMQP_ADDR) {
            return Err(format!(
                "the test broker is not the local one ({AMQP_ADDR}): no listener can be added"
            ));
        }
        let pki = TestPki::generate("rabbitmq")?;
        let setup = RabbitTlsSetup::enable(&pki, require_client_cert)?;
        Ok((pki, setup))
    })();
    match made {
        Ok(made) => Some(made),
        Err(e) if in_ci() => panic!("RabbitMQ TLS setup failed: {e}"),
        Err(e) => {
            eprintln!("SKIPPED (not in CI): RabbitMQ TLS setup failed: {e}");
            None
        }
    }
}

fn amqps(host: &str) -> String {
    format!("amqps://guest:guest@{host}:{RABBIT_TLS_PORT}/%2f")
}

fn ca(path: &std::path::Path) -> RabbitTls {
    RabbitTls::from_files(Some(path), None).expect("CA file")
}

async fn try_connect(url: &str, tls: &RabbitTls) -> Result<lapin::Connection, String> {
    connect_with_tls(url, tls, Duration::from_secs(5))
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn tls_rabbitmq_amqps_with_the_ca_publishes_with_confirms() {
    let _serial = SERIAL.lock().await;
    let Some((pki, _setup)) = tls(false) else {
        return;
    };
    let Some(plain) = common::connection().await else {
        return;
    };
    let names = common::Names::new("tls");
    names
        .topology(QueueSpec::durable(&names.queue))
        .declare(&plain)
        .await
        .expect("declare");
    let publisher = RabbitPublisher::new(RabbitPublisherConfig {
        tls: ca(&pki.ca),
        ..RabbitPublisherConfig::new(amqps("127.0.0.1"))
    });
    let message = NewMessage::new(&names.exchange, "tls.check", b"over TLS".to_vec()).into_message(
        MessageId::from_uuid(*outbox_testkit::message("k", "k").id.as_uuid()),
        Timestamp::now_utc(),
    );
    let outcomes = publisher.publish(&[message]).await;
    assert!(
        matches!(outcomes.as_slice(), [PublishOutcome::Confirmed]),
        "{outcomes:?}"
    );
    assert_eq!(common::depth(&plain, &names.queue).await, 1);
    names.delete(&plain).await;
}

#[tokio::test]
async fn tls_rabbitmq_wrong_ca_fails_naming_rabbitmq() {
    let _serial = SERIAL.lock().await;
    let Some((pki, _setup)) = tls(false) else {
        return;
    };
    let e = try_connect(&amqps("127.0.0.1"), &ca(&pki.other_ca))
        .await
        .expect_err("a broker certificate from another CA must be refused");
    eprintln!("wrong CA: {e}");
    assert!(e.contains("connect to RabbitMQ"), "{e}");
    assert!(e.contains("UnknownIssuer"), "{e}");
    assert!(!e.contains("guest:guest"), "the password is shown: {e}");
    // No CA file: the system's roots do not know the test CA either.
    let e = try_connect(&amqps("127.0.0.1"), &RabbitTls::default())
        .await
        .expect_err("system roots");
    assert!(e.contains("UnknownIssuer"), "{e}");
}

#[tokio::test]
async fn tls_rabbitmq_wrong_host_name_fails_naming_rabbitmq() {
    let _serial = SERIAL.lock().await;
    let Some((pki, _setup)) = tls(false) else {
        return;
    };
    let e = try_connect(&amqps("localhost"), &ca(&pki.ca))
        .await
        .expect_err("a certificate for 127.0.0.1 must not pass for localhost");
    eprintln!("wrong host: {e}");
    assert!(e.contains("connect to RabbitMQ"), "{e}");
    assert!(e.contains("not valid for name"), "{e}");
}

#[tokio::test]
async fn tls_rabbitmq_client_certificate_when_the_broker_requires_one() {
    let _serial = SERIAL.lock().await;
    let Some((pki, _setup)) = tls(true) else {
        return;
    };
    let with_cert = RabbitTls::from_files(
        Some(&pki.ca),
        Some((pki.client_cert.as_path(), pki.client_key.as_path())),
    )
    .expect("files");
    let conn = try_connect(&amqps("127.0.0.1"), &with_cert)
        .await
        .expect("connection with a client certificate");
    conn.create_channel().await.expect("channel");
    let _ = conn.close(200, "done".into()).await;
    let e = try_connect(&amqps("127.0.0.1"), &ca(&pki.ca))
        .await
        .expect_err("the broker requires a client certificate");
    eprintln!("no client certificate: {e}");
    assert!(e.contains("connect to RabbitMQ"), "{e}");
    // Under TLS 1.3 the broker refuses after the client's last handshake message:
    // the client reads either the broker's alert or, when the broker has already
    // closed, a reset. Either way no connection without a certificate.
    assert!(
        [
            "CertificateRequired",
            "Connection reset",
            "Broken pipe",
            "UnexpectedEof"
        ]
        .iter()
        .any(|why| e.contains(why)),
        "refused for the missing certificate: {e}"
    );
}

#[tokio::test]
async fn tls_rabbitmq_files_checked_before_use() {
    let pki = match TestPki::generate("rabbitmq-files") {
        Ok(pki) => pki,
        Err(e) if in_ci() => panic!("{e}"),
        Err(e) => {
            eprintln!("SKIPPED (not in CI): {e}");
            return;
        }
    };
    let e = RabbitTls::from_files(Some(&pki.server_key), None).expect_err("a key");
    assert_eq!(e.what, "CA certificate");
    assert!(e.to_string().contains("holds no PEM certificate"), "{e}");
    let e = RabbitTls::from_files(
        None,
        Some((pki.client_key.as_path(), pki.client_key.as_path())),
    )
    .expect_err("a key as certificate");
    assert_eq!(e.what, "client certificate");
    let e = RabbitTls::from_files(
        None,
        Some((pki.client_cert.as_path(), pki.client_cert.as_path())),
    )
    .expect_err("a certificate as key");
    assert_eq!(e.what, "client key");
    let key = std::fs::read_to_string(&pki.client_key).expect("key");
    assert!(!e.to_string().contains(key.trim()), "the key is shown: {e}");
    let tls = RabbitTls::from_files(
        Some(&pki.ca),
        Some((pki.client_cert.as_path(), pki.client_key.as_path())),
    )
    .expect("files");
    let shown = format!("{tls:?}");
    assert_eq!(shown, "RabbitTls { ca: true, client_certificate: true }");
}
