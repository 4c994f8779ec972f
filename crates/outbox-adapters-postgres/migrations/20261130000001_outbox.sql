-- The outbox, inbox, lock and sweep-state tables. Created in the schema chosen by
-- configuration: the migrator sets search_path to it, so names here are unqualified.

-- Publish side. A producer's smallest INSERT names exchange, routing_key, payload.
CREATE TABLE outbox_messages (
    seq             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id              uuid        NOT NULL DEFAULT gen_random_uuid() UNIQUE,
    exchange        text        NOT NULL,
    routing_key     text        NOT NULL,
    message_type    text,
    headers         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    payload         bytea       NOT NULL,
    content_type    text        NOT NULL DEFAULT 'application/json',
    source          text,
    correlation_id  text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    status          text        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'sent', 'publish_failed', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0,
    last_attempt_at timestamptz,
    next_attempt_at timestamptz,
    last_error      text,
    sent_at         timestamptz,
    locked_by       text,
    locked_until    timestamptz
);

-- Claims read only these partial indexes, so their cost follows the number of unsent
-- rows, not the size of the table. The planner cannot prefer walking the primary key
-- through sent rows: the claim query orders by seq within the exact predicate of
-- outbox_pending, which is the smaller index with the same order.
CREATE INDEX outbox_pending ON outbox_messages (seq) WHERE status = 'pending';
CREATE INDEX outbox_retry_due ON outbox_messages (next_attempt_at, seq) WHERE status = 'publish_failed';
CREATE INDEX outbox_dead ON outbox_messages (seq) WHERE status = 'dead';
CREATE INDEX outbox_leased ON outbox_messages (locked_until) WHERE locked_by IS NOT NULL;
CREATE INDEX outbox_sent_at ON outbox_messages (sent_at) WHERE status = 'sent';

-- Rows change status once or twice and are then deleted by retention: vacuum and
-- analyze early so dead tuples and statistics never lag far behind.
ALTER TABLE outbox_messages SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    fillfactor = 90
);

-- Waking relays. NOTIFY in every producer transaction halves insert throughput
-- (measured), so producers notify only while some relay has declared itself idle.
CREATE TABLE outbox_relay_idle (
    relay       text PRIMARY KEY,
    expires_at  timestamptz NOT NULL
);

-- SET search_path FROM CURRENT pins the migration's schema: producers' sessions have
-- their own search_path.
CREATE FUNCTION outbox_notify_idle_relays() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM outbox_relay_idle WHERE expires_at > now()) THEN
        PERFORM pg_notify('outbox_wakeup.' || TG_TABLE_SCHEMA, '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_wakeup AFTER INSERT ON outbox_messages
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify_idle_relays();

-- Consume side: one row per (consumer, message id).
CREATE TABLE outbox_inbox (
    seq             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer        text        NOT NULL,
    message_id      uuid        NOT NULL,
    exchange        text        NOT NULL,
    routing_key     text        NOT NULL,
    message_type    text,
    headers         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    payload         bytea       NOT NULL,
    content_type    text        NOT NULL DEFAULT 'application/json',
    source          text,
    correlation_id  text,
    created_at      timestamptz NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    status          text        NOT NULL DEFAULT 'sent'
                    CHECK (status IN ('sent', 'consumed', 'consume_failed', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0,
    last_attempt_at timestamptz,
    next_attempt_at timestamptz,
    last_error      text,
    consumed_at     timestamptz,
    locked_by       text,
    locked_until    timestamptz,
    UNIQUE (consumer, message_id)
);

CREATE INDEX inbox_due ON outbox_inbox (consumer, next_attempt_at, seq)
    WHERE status IN ('sent', 'consume_failed');
CREATE INDEX inbox_dead ON outbox_inbox (consumer, seq) WHERE status = 'dead';
CREATE INDEX inbox_consumed_at ON outbox_inbox (consumed_at) WHERE status = 'consumed';

ALTER TABLE outbox_inbox SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01
);

-- Deliveries that could not be decoded, kept with their raw body.
CREATE TABLE outbox_dead_letters (
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer    text        NOT NULL,
    message_id  text,
    routing_key text        NOT NULL,
    headers     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    body        bytea       NOT NULL,
    reason      text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dead_letters_consumer ON outbox_dead_letters (consumer, seq);

-- The cluster lock: a lease row per key. The fencing token comes from a sequence, so
-- it grows on every acquisition and never goes back.
CREATE SEQUENCE outbox_fencing_tokens;
CREATE TABLE outbox_locks (
    key         text PRIMARY KEY,
    holder      text        NOT NULL,
    token       bigint      NOT NULL,
    expires_at  timestamptz NOT NULL
);

-- The last sweep's report per key, with its writer's fencing token and an expiry.
CREATE TABLE outbox_sweep_state (
    key         text PRIMARY KEY,
    report      jsonb       NOT NULL,
    token       bigint      NOT NULL,
    expires_at  timestamptz NOT NULL
);
