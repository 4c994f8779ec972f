-- Per-exchange and per-consumer totals (issue 35's charts over 1 h, 24 h and 7 d):
-- each writer adds what it counted under the name to a minute row (kept a day,
-- read by the hour and day charts) and an hour row (kept a week, read by the week
-- chart), so no chart reads more than 1,440 rows a name. The writers delete what
-- no chart shows any more, at most once a minute each.
SET LOCAL lock_timeout = '5s';
CREATE TABLE IF NOT EXISTS outbox_throughput_named (
    kind    text        NOT NULL
        CHECK (kind IN ('published', 'consumed', 'publish_failed', 'consume_failed')),
    name    text        NOT NULL,
    -- The row's length in seconds: 60 (a minute) or 3600 (an hour).
    width   integer     NOT NULL CHECK (width IN (60, 3600)),
    start   timestamptz NOT NULL,
    count   bigint      NOT NULL CHECK (count >= 0),
    PRIMARY KEY (kind, name, width, start)
);
-- The writers' forgetting reads by age, across names.
CREATE INDEX IF NOT EXISTS outbox_throughput_named_age
    ON outbox_throughput_named (width, start);
