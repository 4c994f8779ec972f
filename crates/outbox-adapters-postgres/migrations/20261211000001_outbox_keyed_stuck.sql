-- The operator's list of blocked ordering keys walks the keys that have a failing
-- or dead row, one probe each, over outbox_keyed_stuck: a page then costs the
-- stuck keys it passes, never the healthy keys (outbox_ordered holds every key
-- with an unsent row). Rows enter it only while they fail or are dead. On a large
-- table in use, build it first by hand (CREATE INDEX CONCURRENTLY IF NOT EXISTS
-- with the same definition) and this migration finds it.

SET LOCAL lock_timeout = '5s';

CREATE INDEX IF NOT EXISTS outbox_keyed_stuck ON outbox_messages (ordering_key, seq)
    WHERE ordering_key IS NOT NULL AND status IN ('publish_failed', 'dead');
