-- What AMQP cannot carry is refused at INSERT, with an error naming the column:
-- the relay could never publish such a row. AMQP short strings (exchange, routing
-- key, type, content type, correlation id, app id = source, header names) are at
-- most 255 bytes; headers must be a JSON object whose values are strings.
--
-- Rows already in the table when this migration runs are exempt (seq <= the
-- highest seq then): a CHECK applies to every UPDATE of a row too, and the relay
-- must still be able to claim such a row and mark it dead (it does so, naming the
-- column). seq is an identity column, so a producer cannot claim an old one.

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
    existing bigint := (SELECT coalesce(max(seq), 0) FROM outbox_messages);
    col text;
BEGIN
    FOREACH col IN ARRAY ARRAY['exchange', 'routing_key', 'message_type', 'content_type',
                               'correlation_id', 'source'] LOOP
        EXECUTE format(
            'ALTER TABLE outbox_messages ADD CONSTRAINT %I CHECK (seq <= %s OR octet_length(%I) <= 255)',
            'outbox_messages_' || col || '_amqp', existing, col);
        EXECUTE format(
            'COMMENT ON CONSTRAINT %I ON outbox_messages IS %L',
            'outbox_messages_' || col || '_amqp',
            col || ' is an AMQP short string: at most 255 bytes');
    END LOOP;
    EXECUTE format(
        'ALTER TABLE outbox_messages ADD CONSTRAINT outbox_messages_headers_amqp '
        'CHECK (seq <= %s OR outbox_headers_fit_amqp(headers))', existing);
    COMMENT ON CONSTRAINT outbox_messages_headers_amqp ON outbox_messages IS
        'headers must be a JSON object of strings, each name 1 to 255 bytes';
    EXECUTE format(
        'ALTER TABLE outbox_messages ADD CONSTRAINT outbox_messages_headers_size_amqp '
        'CHECK (seq <= %s OR outbox_headers_amqp_size(headers) <= 65536)', existing);
    COMMENT ON CONSTRAINT outbox_messages_headers_size_amqp ON outbox_messages IS
        'headers take at most 65536 bytes as AMQP encodes them (outbox_core::message::MAX_HEADERS_BYTES)';
END
$$;
