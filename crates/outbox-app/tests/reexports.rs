//! outbox-app is deprecated for one release: its old paths must name the items of
//! the crates the services moved to (outbox-relay, outbox-consumer, outbox-runtime,
//! outbox-cli), not copies of them. Each check compiles only when the old and the
//! new path name the same type or the same function; the services' own tests are in
//! those crates.

use std::marker::PhantomData;

/// Compiles only when `old` and `new` are the same type.
fn same_type<T: ?Sized>(_old: PhantomData<T>, _new: PhantomData<T>) {}

/// Compiles only when `old` and `new` are the same function: each function item has
/// a type of its own.
fn same_fn<F>(_old: F, _new: F) {}

macro_rules! same_types {
    ($($old:ty => $new:ty),+ $(,)?) => {
        $(same_type(PhantomData::<$old>, PhantomData::<$new>);)+
    };
}

#[test]
fn the_relays_old_paths_name_outbox_relays_items() {
    same_types!(
        outbox_app::Dispatcher => outbox_relay::Dispatcher,
        outbox_app::DispatcherConfig => outbox_relay::DispatcherConfig,
        outbox_app::PublishCounts => outbox_relay::PublishCounts,
        outbox_app::PublishRetryTask => outbox_relay::PublishRetryTask,
        outbox_app::RelayBuilder => outbox_relay::RelayBuilder,
        outbox_app::RelayCounters => outbox_relay::RelayCounters,
        outbox_app::RelayHandles => outbox_relay::RelayHandles,
        outbox_app::RetentionConfig => outbox_relay::RetentionConfig,
        outbox_app::SentRetentionTask => outbox_relay::SentRetentionTask,
        outbox_app::VacuumMode => outbox_relay::VacuumMode,
        outbox_app::relay::Dispatcher => outbox_relay::dispatcher::Dispatcher,
        outbox_app::service::RelayBuilder => outbox_relay::service::RelayBuilder,
        outbox_app::sent_retention::SentRetentionTask => outbox_relay::sent_retention::SentRetentionTask,
    );
    same_fn(
        outbox_app::relay::publish_claimed,
        outbox_relay::dispatcher::publish_claimed,
    );
    same_fn(
        outbox_app::relay::idle_wait,
        outbox_relay::dispatcher::idle_wait,
    );
    #[cfg(feature = "postgres")]
    same_types!(
        outbox_app::PgWakeupSource => outbox_relay::PgWakeupSource,
        outbox_app::pg_wakeup::PgWakeupSource => outbox_relay::pg_wakeup::PgWakeupSource,
    );
}

#[test]
fn the_consumers_old_paths_name_outbox_consumers_items() {
    same_types!(
        outbox_app::AttemptContext<'static> => outbox_consumer::AttemptContext<'static>,
        outbox_app::ConsumeRetryTask => outbox_consumer::ConsumeRetryTask,
        outbox_app::ConsumerConfig => outbox_consumer::ConsumerConfig,
        outbox_app::ConsumerCounters => outbox_consumer::ConsumerCounters,
        outbox_app::ConsumerRetention => outbox_consumer::ConsumerRetention,
        outbox_app::ConsumerWorker => outbox_consumer::ConsumerWorker,
        outbox_app::Failure => outbox_consumer::Failure,
        outbox_app::Handled => outbox_consumer::Handled,
        dyn outbox_app::Handler => dyn outbox_consumer::Handler,
        outbox_app::HandlerError => outbox_consumer::HandlerError,
        outbox_app::HandlerRegistry => outbox_consumer::HandlerRegistry,
        outbox_app::Handlers<dyn outbox_app::Handler> => outbox_consumer::Handlers<dyn outbox_consumer::Handler>,
        dyn outbox_app::InboxPath => dyn outbox_consumer::InboxPath,
        outbox_app::InboxRetryTask<outbox_app::NeutralInbox> => outbox_consumer::InboxRetryTask<outbox_consumer::NeutralInbox>,
        outbox_app::InboxWorker<outbox_app::NeutralInbox> => outbox_consumer::InboxWorker<outbox_consumer::NeutralInbox>,
        outbox_app::NeutralInbox => outbox_consumer::NeutralInbox,
        outbox_app::Unrecorded => outbox_consumer::Unrecorded,
        outbox_app::consumer::ConsumerWorker => outbox_consumer::worker::ConsumerWorker,
        outbox_app::consumer_retention::ConsumerRetention => outbox_consumer::retention::ConsumerRetention,
    );
    #[cfg(feature = "postgres")]
    same_types!(
        outbox_app::PgConsumeRetryTask => outbox_consumer::PgConsumeRetryTask,
        outbox_app::PgConsumerWorker => outbox_consumer::PgConsumerWorker,
        dyn outbox_app::PgHandler => dyn outbox_consumer::PgHandler,
        outbox_app::PgHandlerRegistry => outbox_consumer::PgHandlerRegistry,
        outbox_app::PgTxInbox => outbox_consumer::PgTxInbox,
        outbox_app::pg_consumer::PgConsumerWorker => outbox_consumer::pg::PgConsumerWorker,
    );
}

#[test]
fn the_runtimes_old_paths_name_outbox_runtimes_items() {
    same_types!(
        outbox_app::CancellationToken => outbox_runtime::CancellationToken,
        outbox_app::LeaseFactory => outbox_runtime::LeaseFactory,
        outbox_app::Random => outbox_runtime::Random,
        outbox_app::RetrySweeper => outbox_runtime::RetrySweeper,
        outbox_app::ServiceHealth => outbox_runtime::ServiceHealth,
        dyn outbox_app::SweepTask => dyn outbox_runtime::SweepTask,
        outbox_app::ThroughputRecorder => outbox_runtime::ThroughputRecorder,
        outbox_app::lease::LeaseFactory => outbox_runtime::lease::LeaseFactory,
        outbox_app::stall::RelayProgress => outbox_runtime::stall::RelayProgress,
        outbox_app::supervision::ServiceHealth => outbox_runtime::supervision::ServiceHealth,
        outbox_app::sweeper::RetrySweeper => outbox_runtime::sweeper::RetrySweeper,
        outbox_app::throughput::ThroughputRecorder => outbox_runtime::throughput::ThroughputRecorder,
    );
    same_fn(outbox_app::default_random, outbox_runtime::default_random);
    same_fn(outbox_app::sleep_or_cancel, outbox_runtime::sleep_or_cancel);
    assert_eq!(
        outbox_app::DEFAULT_STALL_AFTER,
        outbox_runtime::DEFAULT_STALL_AFTER
    );
}

#[test]
fn the_command_lines_old_paths_name_outbox_clis_items() {
    #[cfg(feature = "http")]
    {
        same_types!(outbox_app::http::HttpState => outbox_cli::http::HttpState);
        same_fn(outbox_app::http::serve, outbox_cli::http::serve);
        same_fn(
            outbox_app::http::serve_consumer_ready,
            outbox_cli::http::serve_consumer_ready,
        );
    }
    #[cfg(feature = "otel")]
    {
        same_types!(outbox_app::otel::OtlpSettings => outbox_cli::otel::OtlpSettings);
        same_fn(
            outbox_app::otel::install_propagator,
            outbox_cli::otel::install_propagator,
        );
    }
    #[cfg(feature = "admin")]
    same_types!(outbox_app::admin_api::AdminConfig => outbox_cli::admin_api::AdminConfig);
    #[cfg(feature = "cli")]
    {
        same_types!(outbox_app::config::RelayConfig => outbox_cli::config::RelayConfig);
        same_fn(outbox_app::wiring::wire, outbox_cli::wiring::wire);
    }
}
