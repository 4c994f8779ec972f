//! RabbitMQ adapter of `outbox` on lapin.
//!
//! - [`RabbitPublisher`]: publisher confirms on its channel; a batch is published
//!   pipelined and each message gets its own outcome. `mandatory` is set and a
//!   returned message is a failure even though the broker acks it. Missing exchanges
//!   are found by a passive declare first, so only their messages fail. A lost
//!   connection fails what was in flight (to be retried) and the next batch
//!   reconnects; a confirm that does not come within the timeout is a failure; while
//!   the broker blocks the connection (memory or disk alarm) nothing is published.
//! - [`RabbitSubscriber`]: manual acknowledgement, prefetch, reconnects after a broker
//!   restart.
//! - [`Topology`]: exchanges, queues (classic or quorum, dead-letter exchange) and
//!   bindings, declared idempotently at start.
//!
//! Several nodes of one cluster can be given (`failover_urls`): a connection goes to
//! one of them, starting at a random one, and after a loss to the next (see
//! [`connect_any`]).
//!
//! URLs are shown with their password replaced by `***`.
//!
//! TLS: an `amqps://` URL connects over rustls (ring provider), verifying the
//! broker's certificate and host name against the system's root certificates and,
//! when given, a CA file; a client certificate can be presented ([`RabbitTls`]).

mod convert;
mod nodes;
mod publisher;
mod queues;
mod subscriber;
mod tls;
mod topology;

use std::time::Duration;

use outbox_core::config::{redact_secret_in, redact_url};
use outbox_ports::PortError;

/// The lapin this adapter is built on (4): for declaring or deleting what
/// [`Topology`] does not cover, on a connection from [`connect`].
pub use lapin;
pub use publisher::{RabbitPublisher, RabbitPublisherConfig};
pub use queues::RabbitQueueDepths;
pub use subscriber::RabbitSubscriber;
pub use tls::{RabbitTls, TlsFileError};
pub use topology::{
    BindingSpec, Declared, ExchangeKind, ExchangeSpec, Overflow, QueueSpec, QueueType, Topology,
    TopologyError,
};

/// Opens a connection to `url` within `timeout`.
///
/// # Errors
/// [`PortError::Transient`] when the broker cannot be reached or refuses the login;
/// the message shows the URL without its password.
pub async fn connect(url: &str, timeout: Duration) -> Result<lapin::Connection, PortError> {
    connect_with_tls(url, &RabbitTls::default(), timeout).await
}

/// As [`connect`], with the CA and client certificate of `tls` for an `amqps://`
/// URL. A certificate the broker presents that does not verify (unknown issuer,
/// another host name) fails the connection, the message naming RabbitMQ and the
/// reason.
///
/// # Errors
/// As [`connect`].
pub async fn connect_with_tls(
    url: &str,
    tls: &RabbitTls,
    timeout: Duration,
) -> Result<lapin::Connection, PortError> {
    let properties = lapin::ConnectionProperties::default();
    let runtime = lapin::runtime::default_runtime()
        .map_err(|e| PortError::fatal("connect to RabbitMQ", format!("no async runtime: {e}")))?;
    let connecting =
        lapin::Connection::connect_with_config(url, properties, tls.lapin_config(), runtime);
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => {
            // A refused login is said so first (it stays retryable: an operator
            // may fix the user or its permissions without a restart).
            let refused =
                matches!(e.kind(), lapin::ErrorKind::ProtocolError(amqp) if amqp.get_id() == 403);
            Err(PortError::transient(
                "connect to RabbitMQ",
                format!(
                    "{}{}: {}",
                    if refused {
                        "the broker refused the login (check the URL's user, password and vhost) at "
                    } else {
                        ""
                    },
                    redact_url(url),
                    redact_secret_in(&e.to_string(), url)
                ),
            ))
        }
        Err(_) => Err(PortError::transient(
            "connect to RabbitMQ",
            format!("{}: no connection within {timeout:?}", redact_url(url)),
        )),
    }
}

/// A connection to the first of `urls` (nodes of one cluster) that accepts one,
/// trying each in turn from a random one, each within `timeout`.
///
/// # Errors
/// [`PortError::Transient`] naming every node tried and why (without passwords);
/// [`PortError::Fatal`] for an empty list.
pub async fn connect_any(
    urls: &[String],
    tls: &RabbitTls,
    timeout: Duration,
) -> Result<lapin::Connection, PortError> {
    let Some((first, more)) = urls.split_first() else {
        return Err(PortError::fatal(
            "connect to RabbitMQ",
            "no broker URL given",
        ));
    };
    nodes::Nodes::new(first, more)
        .connect(tls, timeout, None)
        .await
        .map(|(connection, _)| connection)
}

/// Maps a lapin error: a refused operation that names a missing entity is
/// `NotFound`; a broken connection or channel is retryable; the rest is fatal.
fn port(operation: &'static str, what: &'static str, id: &str, e: &lapin::Error) -> PortError {
    if let lapin::ErrorKind::ProtocolError(amqp) = e.kind()
        && amqp.get_id() == 404
    {
        return PortError::NotFound {
            what,
            id: id.to_owned(),
        };
    }
    let message = e.to_string();
    match e.kind() {
        lapin::ErrorKind::ProtocolError(_)
        | lapin::ErrorKind::IOError(_)
        | lapin::ErrorKind::InvalidChannelState(..)
        | lapin::ErrorKind::InvalidConnectionState(_)
        | lapin::ErrorKind::MissingHeartbeatError
        | lapin::ErrorKind::InvalidChannel(_)
        | lapin::ErrorKind::ChannelsLimitReached => PortError::transient(operation, message),
        _ => PortError::fatal(operation, message),
    }
}
