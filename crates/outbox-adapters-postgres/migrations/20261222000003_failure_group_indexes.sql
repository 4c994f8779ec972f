-- A failure group's members, listed and counted (issue 49): only rows that
-- ever failed are in these indexes. By the group's md5, not its text: a group
-- holds up to 4,096 characters of an error (more with its placeholders), past
-- what a btree entry may hold (2,704 bytes), and one such row would fail every
-- mark of its batch. A filter by group compares the hash (the index) and then
-- the text. On a large table in use, build them first by hand (CREATE INDEX
-- CONCURRENTLY IF NOT EXISTS with the same definitions) and this migration
-- finds them.
SET LOCAL lock_timeout = '5s';

CREATE INDEX IF NOT EXISTS outbox_error_group ON outbox_messages (md5(error_group), seq)
    WHERE error_group IS NOT NULL;
CREATE INDEX IF NOT EXISTS inbox_error_group ON outbox_inbox (consumer, md5(error_group), seq)
    WHERE error_group IS NOT NULL;
