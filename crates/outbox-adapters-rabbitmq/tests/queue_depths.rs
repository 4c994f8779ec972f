//! The depth of the consumers' queues, read passively from the broker (issue
//! 49: the overview says what waits in a queue beside what waits in the outbox).

mod common;

use std::time::Duration;

use common::Names;
use lapin::BasicProperties;
use lapin::options::BasicPublishOptions;
use outbox_adapters_rabbitmq::{QueueSpec, RabbitQueueDepths, RabbitTls};
use outbox_ports::QueueDepths;

#[tokio::test]
async fn depths_are_read_per_queue_and_a_missing_one_is_unknown() {
    with_broker!(|conn| {
        let names = Names::new("depths");
        names
            .topology(QueueSpec::durable(names.queue.clone()))
            .declare(&conn)
            .await
            .expect("declare");
        let ch = conn.create_channel().await.expect("channel");
        for i in 0..3 {
            ch.basic_publish(
                "".into(),
                names.queue.as_str().into(),
                BasicPublishOptions::default(),
                format!("{i}").as_bytes(),
                BasicProperties::default(),
            )
            .await
            .expect("publish")
            .await
            .expect("confirm");
        }
        let missing = format!("{}.missing", names.queue);
        let depths = RabbitQueueDepths::new(
            vec![common::url()],
            RabbitTls::default(),
            vec![missing.clone(), names.queue.clone()],
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let read = loop {
            let read = depths.queue_depths().await.expect("depths");
            if read[1].messages == Some(3) || tokio::time::Instant::now() > deadline {
                break read;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(read.len(), 2, "{read:?}");
        assert_eq!(
            (read[0].queue.as_str(), read[0].messages, read[0].consumers),
            (missing.as_str(), None, None),
            "a queue that does not exist is unknown, not created"
        );
        assert_eq!(
            (read[1].queue.as_str(), read[1].messages, read[1].consumers),
            (names.queue.as_str(), Some(3), Some(0))
        );
        // Read again over the same connection: the missing queue closed only its
        // channel.
        let again = depths.queue_depths().await.expect("again");
        assert_eq!(again[1].messages, Some(3));
        assert!(
            common::connection().await.is_some(),
            "the broker is still there"
        );
        let check = conn.create_channel().await.expect("channel");
        let declared = check
            .queue_declare(
                missing.as_str().into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                lapin::types::FieldTable::default(),
            )
            .await;
        assert!(declared.is_err(), "the missing queue was not declared");
        names.delete(&conn).await;
    });
}
