-- What AMQP cannot carry is refused at INSERT, with an error naming the column:
-- the relay could never publish such a row. AMQP short strings (exchange, routing
-- key, type, content type, correlation id, app id = source, header names) are at
-- most 255 bytes; headers must be a JSON object whose values are strings, at most
-- 64 KiB as AMQP encodes them; created_at is finite and before the year 10000
-- (the relay reads it into a time that holds years up to 9999).
--
-- Rows already in the table when this migration runs are exempt (seq <= the
-- highest seq then): a CHECK applies to every UPDATE of a row too, and the relay
-- must still be able to claim such a row and mark it dead (it does so, naming the
-- column). seq is an identity column, so a producer cannot claim an old one.
--
-- On a large table in use: the constraints are added NOT VALID, so nothing scans
-- the table (the exemption makes every existing row pass anyway; NOT VALID
-- constraints are still enforced on every INSERT and UPDATE); the table is locked
-- before its highest seq is read, so no row committed in between escapes both the
-- exemption and the check; and the lock is waited for at most lock_timeout: a
-- long transaction on the table fails the migration (run it again) instead of
-- queueing every producer behind the waiting ALTER TABLE. sqlx runs a migration in
-- one transaction, so SET LOCAL ends with it.

SET LOCAL lock_timeout = '5s';

-- ADD CONSTRAINT ... CHECK takes ACCESS EXCLUSIVE whatever else: take it at once
-- (a weaker lock upgraded later could deadlock with a reader that writes next).
-- Everything done under it is a catalog change or an index lookup.
LOCK TABLE outbox_messages IN ACCESS EXCLUSIVE MODE;

CREATE FUNCTION outbox_headers_fit_amqp(headers jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog AS $$
    SELECT jsonb_typeof(headers) = 'object' AND NOT EXISTS (
        SELECT 1 FROM jsonb_each(headers) AS h(name, value)
        WHERE jsonb_typeof(h.value) <> 'string'
           OR octet_length(h.name) NOT BETWEEN 1 AND 255)
$$;

-- The headers' size as AMQP encodes them (name and value plus 6 bytes of framing
-- each), as outbox_core::message::amqp_headers_len counts it: a content header
-- larger than the broker's frame_max closes the relay's whole connection.
CREATE FUNCTION outbox_headers_amqp_size(headers jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog AS $$
    SELECT CASE WHEN jsonb_typeof(headers) = 'object' THEN (
        SELECT coalesce(sum(octet_length(h.name) + octet_length(h.value) + 6), 0)
        FROM jsonb_each_text(headers) AS h(name, value)) ELSE 0 END
$$;

DO $$
DECLARE
    -- Read under the lock above: no producer can commit a row past it meanwhile.
    existing bigint := (SELECT coalesce(max(seq), 0) FROM outbox_messages);
    col text;
    checks text[] := ARRAY[]::text[];
BEGIN
    FOREACH col IN ARRAY ARRAY['exchange', 'routing_key', 'message_type', 'content_type',
                               'correlation_id', 'source'] LOOP
        checks := checks || format(
            'ADD CONSTRAINT %I CHECK (seq <= %s OR octet_length(%I) <= 255) NOT VALID',
            'outbox_messages_' || col || '_amqp', existing, col);
    END LOOP;
    checks := checks || format(
        'ADD CONSTRAINT outbox_messages_headers_amqp '
        'CHECK (seq <= %s OR outbox_headers_fit_amqp(headers)) NOT VALID', existing);
    checks := checks || format(
        'ADD CONSTRAINT outbox_messages_headers_size_amqp '
        'CHECK (seq <= %s OR outbox_headers_amqp_size(headers) <= 65536) NOT VALID', existing);
    -- The same predicate as the relay's read (rows::time_is_readable).
    checks := checks || format(
        'ADD CONSTRAINT outbox_messages_created_at_amqp '
        'CHECK (seq <= %s OR (isfinite(created_at) AND created_at < %L::timestamptz)) NOT VALID',
        existing, '10000-01-01 00:00:00+00');
    -- One statement: one pass over the catalog, no table scan (NOT VALID).
    EXECUTE 'ALTER TABLE outbox_messages ' || array_to_string(checks, ', ');

    FOREACH col IN ARRAY ARRAY['exchange', 'routing_key', 'message_type', 'content_type',
                               'correlation_id', 'source'] LOOP
        EXECUTE format(
            'COMMENT ON CONSTRAINT %I ON outbox_messages IS %L',
            'outbox_messages_' || col || '_amqp',
            col || ' is an AMQP short string: at most 255 bytes');
    END LOOP;
    COMMENT ON CONSTRAINT outbox_messages_headers_amqp ON outbox_messages IS
        'headers must be a JSON object of strings, each name 1 to 255 bytes';
    COMMENT ON CONSTRAINT outbox_messages_headers_size_amqp ON outbox_messages IS
        'headers take at most 65536 bytes as AMQP encodes them (outbox_core::message::MAX_HEADERS_BYTES)';
    COMMENT ON CONSTRAINT outbox_messages_created_at_amqp ON outbox_messages IS
        'created_at must be finite and before the year 10000';
END
$$;
