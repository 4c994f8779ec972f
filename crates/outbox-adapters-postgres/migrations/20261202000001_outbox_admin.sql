-- The operator's side (admin API, CLI): the audit log and the indexes its lists and
-- searches read, so that a list filtered by status or searched by id never scans
-- the table (tests/admin_scale.rs checks the plans with 1,000,000 rows).

-- Every write done by an operator.
CREATE TABLE outbox_audit (
    seq     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    actor   text        NOT NULL,
    action  text        NOT NULL,
    target  text        NOT NULL,
    count   bigint      NOT NULL,
    at      timestamptz NOT NULL DEFAULT now()
);

-- Search by correlation id (`q`); most messages have none.
CREATE INDEX outbox_correlation ON outbox_messages (correlation_id)
    WHERE correlation_id IS NOT NULL;
CREATE INDEX inbox_correlation ON outbox_inbox (consumer, correlation_id)
    WHERE correlation_id IS NOT NULL;

-- A page of failed messages, newest first (pending and dead have theirs:
-- outbox_pending, outbox_dead; sent rows are most of the table, so the primary
-- key walked backwards finds them at once).
CREATE INDEX outbox_publish_failed ON outbox_messages (seq) WHERE status = 'publish_failed';

-- A consumer's deliveries, newest first; and one message's deliveries across
-- consumers (the one-record view), which the (consumer, message_id) key cannot serve.
CREATE INDEX inbox_consumer_seq ON outbox_inbox (consumer, seq);
CREATE INDEX inbox_message ON outbox_inbox (message_id);
