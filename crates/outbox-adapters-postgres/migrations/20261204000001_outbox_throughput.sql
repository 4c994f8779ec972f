-- Messages completed per minute (published, consumed), added by every relay and
-- consumer every few seconds: the admin API's charts of the last hour read at most
-- sixty rows a kind, however many messages went through. Rows older than a day are
-- deleted by the writers themselves.
CREATE TABLE outbox_throughput (
    kind    text        NOT NULL CHECK (kind IN ('published', 'consumed')),
    minute  timestamptz NOT NULL,
    count   bigint      NOT NULL CHECK (count >= 0),
    PRIMARY KEY (kind, minute)
);
