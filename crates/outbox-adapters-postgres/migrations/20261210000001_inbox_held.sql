-- Deliveries held behind an earlier one of their ordering key are written without
-- a next attempt time (outside inbox_due's due range) and made due when their
-- predecessor finishes. inbox_held holds only those rows, so the safety net that
-- releases a held row whose predecessor's process died between the two statements
-- walks the keys that have held rows (one probe each), not every key with an
-- unfinished delivery. On a large inbox in use, build it first by hand (CREATE
-- INDEX CONCURRENTLY IF NOT EXISTS with the same definition) and this migration
-- finds it.
-- Before going back to a release older than this one, make the held rows due
-- (the older claim needs a time, and its head rule still keeps each key's order):
--   UPDATE outbox_inbox SET next_attempt_at = now()
--    WHERE status = 'sent' AND next_attempt_at IS NULL;

SET LOCAL lock_timeout = '5s';

CREATE INDEX IF NOT EXISTS inbox_held ON outbox_inbox (consumer, ordering_key, seq)
    WHERE status = 'sent' AND next_attempt_at IS NULL AND ordering_key IS NOT NULL;
