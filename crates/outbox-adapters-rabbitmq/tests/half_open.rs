//! The publisher's readiness check on a connection whose network forwards nothing
//! and closes nothing: it fails within its 4 s round trip (under the 5 s a relay's
//! `/readyz` gives it), whatever the confirm timeout, drops the connection, and
//! passes again through a new one once the network heals.

mod common;

use std::time::{Duration, Instant};

use outbox_adapters_rabbitmq::{RabbitPublisher, RabbitPublisherConfig};
use outbox_ports::Publisher;
use outbox_testkit::proxy::{TcpProxy, host_port};

#[tokio::test]
async fn the_check_fails_in_time_on_a_half_open_connection_and_recovers() {
    with_broker!(|conn| {
        drop(conn);
        let url = common::url();
        let proxy = TcpProxy::start(host_port(&url).expect("host:port"))
            .await
            .expect("proxy");
        let publisher = RabbitPublisher::new(RabbitPublisherConfig {
            // The default: a publish may wait this long for its confirm; the check
            // must not.
            confirm_timeout: Duration::from_secs(30),
            ..RabbitPublisherConfig::new(proxy.url_for(&url))
        });
        publisher.check().await.expect("reachable");
        let connections = proxy.forwarded();
        proxy.stall();
        let started = Instant::now();
        let err = tokio::time::timeout(Duration::from_secs(20), publisher.check())
            .await
            .expect("the check answered within 20 s")
            .expect_err("nothing comes back");
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(5),
            "failed after {took:?}: {err}"
        );
        assert!(
            err.to_string().contains("did not answer within 4s"),
            "{err}"
        );
        proxy.resume();
        publisher.check().await.expect("reachable again");
        assert!(
            proxy.forwarded() > connections,
            "the stalled connection was dropped and a new one opened"
        );
    });
}
