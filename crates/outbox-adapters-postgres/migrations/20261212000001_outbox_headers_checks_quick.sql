-- The two headers checks of 20261201000001 refuse the same rows, at a fraction of
-- the cost. PostgreSQL checks every CHECK constraint on every INSERT and on every
-- UPDATE of a row (the relay's claim and mark each rewrite it), and the old checks
-- were SQL functions it cannot inline (they read jsonb_each and SET search_path):
-- each statement planned both functions again, and each row paid two more calls
-- (measured about 110 to 150 us a single-row INSERT, and 6 us a row and function).
--
-- Each check now tries first a condition made of built-in operators only, which
-- implies the function's answer, and calls the function only when it fails:
--   headers_amqp: an object, no empty name, every value a string (jsonpath), every
--     name under 64 characters, so at most 252 bytes in any server encoding (at
--     most 4 bytes a character), which is within the 1 to 255 bytes the function
--     allows. A name of 64 to 255 characters, or a bad row, goes to the function.
--   headers_size_amqp: the headers' text is at most 65536 bytes. That text holds
--     each "name": "value" (4 quotes, a colon and a space: the 6 bytes of framing
--     the function counts), escaped (never shorter), a value that is not a string
--     written as jsonb_each_text reads it, ", " between entries and the braces, so
--     it is never shorter than the function's count.
-- Neither condition is ever NULL where it matters: coalesce makes the first false
-- on NULL (a CHECK passes on NULL), and headers is NOT NULL.
--
-- The exemption of older rows is kept as it was: its bound is read back from the
-- constraint being replaced (printed (seq <= 5) for an int4 literal, (seq <=
-- '3000000000'::bigint) past 2^31). As in 20261201000001: the table is locked first,
-- for at most lock_timeout, and the constraints are added NOT VALID (no scan); so a
-- constraint someone validated by hand reads as not validated again (every row
-- passes it all the same).

SET LOCAL lock_timeout = '5s';

LOCK TABLE outbox_messages IN ACCESS EXCLUSIVE MODE;

DO $$
DECLARE
    fit_exempt text;
    size_exempt text;
BEGIN
    SELECT substring(pg_get_constraintdef(c.oid) FROM E'\\(seq <= ''?(\\d+)') INTO fit_exempt
    FROM pg_constraint c
    WHERE c.conrelid = 'outbox_messages'::regclass AND c.conname = 'outbox_messages_headers_amqp';
    SELECT substring(pg_get_constraintdef(c.oid) FROM E'\\(seq <= ''?(\\d+)') INTO size_exempt
    FROM pg_constraint c
    WHERE c.conrelid = 'outbox_messages'::regclass AND c.conname = 'outbox_messages_headers_size_amqp';
    IF fit_exempt IS NULL OR size_exempt IS NULL THEN
        RAISE EXCEPTION 'outbox_messages_headers_amqp and outbox_messages_headers_size_amqp '
            'are not as 20261201000001 made them (seq <= n OR ...): put them back first';
    END IF;

    EXECUTE format(
        'ALTER TABLE outbox_messages '
        'DROP CONSTRAINT outbox_messages_headers_amqp, '
        'DROP CONSTRAINT outbox_messages_headers_size_amqp, '
        'ADD CONSTRAINT outbox_messages_headers_amqp CHECK (seq <= %s '
        'OR coalesce(jsonb_typeof(headers) = %L AND NOT headers ? %L '
        'AND NOT headers @? %L::jsonpath AND NOT headers @? %L::jsonpath, false) '
        'OR outbox_headers_fit_amqp(headers)) NOT VALID, '
        'ADD CONSTRAINT outbox_messages_headers_size_amqp CHECK (seq <= %s '
        'OR octet_length(headers::text) <= 65536 '
        'OR outbox_headers_amqp_size(headers) <= 65536) NOT VALID',
        fit_exempt, 'object', '',
        'strict $.* ? (@.type() != "string")',
        'strict $.keyvalue() ? (@.key like_regex "^.{64}" flag "s")',
        size_exempt);

    COMMENT ON CONSTRAINT outbox_messages_headers_amqp ON outbox_messages IS
        'headers must be a JSON object of strings, each name 1 to 255 bytes';
    COMMENT ON CONSTRAINT outbox_messages_headers_size_amqp ON outbox_messages IS
        'headers take at most 65536 bytes as AMQP encodes them (outbox_core::message::MAX_HEADERS_BYTES)';
END
$$;
