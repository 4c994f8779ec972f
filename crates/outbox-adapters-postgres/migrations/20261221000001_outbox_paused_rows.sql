-- A paused exchange's rows out of the claims' way (issue 47). The claims passed
-- over a paused exchange's rows by a filter on the exchange (outbox_pauses, read
-- once per claim), so every claim and every idle relay's work check stepped over
-- the whole paused backlog: 22.8 and 32.6 ms per 100,000 paused rows, and each
-- commit into the paused exchange woke the idle relays into both.
--
-- Now each unsent row says whether its exchange is paused (`paused`), and the
-- claims' indexes hold unflagged rows only (`AND NOT paused`): a pick never reads
-- a paused row, so its cost follows the rows it can take. (A leading `paused`
-- column instead made each index larger than outbox_pending, which the planner
-- then preferred under stale statistics, stepping over keyed and delayed rows.)
-- The flagged rows have two small indexes of their own: outbox_paused for a
-- resume, outbox_paused_pending for the stats' oldest message waiting. The flag is set as a row
-- is written (a trigger reading outbox_pauses), by a pause for the exchange's
-- unsent rows, and cleared by a resume (through outbox_paused), both in the pause
-- store's transaction. The claims still filter on outbox_pauses too, the rule
-- itself: a row written by a transaction already under way when the pause
-- committed is flagged only by the next pause of that name, and is passed over
-- by the filter meanwhile. The trigger locks the pause's row (KEY SHARE), so a
-- resume waits for the transactions writing into the exchange and then clears
-- their rows as well: no row stays flagged once its exchange is resumed.
--
-- Keyed rows keep outbox_ordered and outbox_ordered_live: a paused exchange's
-- head holds its key (one probe per paused key, as for a failing head).
--
-- On a large table in use, add the column (a catalog change) and build the
-- indexes first by hand (CREATE INDEX CONCURRENTLY IF NOT EXISTS with the same
-- definitions and names); this migration finds them.

SET LOCAL lock_timeout = '5s';

ALTER TABLE outbox_messages ADD COLUMN IF NOT EXISTS paused boolean NOT NULL DEFAULT false;

CREATE INDEX IF NOT EXISTS outbox_pending_unkeyed_unpaused ON outbox_messages (seq)
    WHERE status = 'pending' AND not_before IS NULL AND ordering_key IS NULL AND NOT paused;
CREATE INDEX IF NOT EXISTS outbox_scheduled_unkeyed_unpaused ON outbox_messages (not_before, seq)
    WHERE status = 'pending' AND not_before IS NOT NULL AND ordering_key IS NULL AND NOT paused;
CREATE INDEX IF NOT EXISTS outbox_retry_due_unpaused ON outbox_messages (next_attempt_at, seq)
    WHERE status = 'publish_failed' AND NOT paused;
-- The flagged rows only (a paused exchange's): by exchange, for a resume; the
-- immediate unkeyed ones by seq, for the stats' oldest message waiting.
CREATE INDEX IF NOT EXISTS outbox_paused ON outbox_messages (exchange) WHERE paused;
CREATE INDEX IF NOT EXISTS outbox_paused_pending ON outbox_messages (seq)
    WHERE paused AND status = 'pending' AND not_before IS NULL AND ordering_key IS NULL;

-- An index a failed CREATE INDEX CONCURRENTLY left INVALID has the name but not
-- the content: refuse it rather than rename it into place (claims would scan).
DO $$
DECLARE
    bad text;
BEGIN
    SELECT string_agg(c.relname::text, ', ') INTO bad
      FROM pg_index i
      JOIN pg_class c ON c.oid = i.indexrelid
     WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
       AND c.relname IN ('outbox_pending_unkeyed_unpaused', 'outbox_scheduled_unkeyed_unpaused',
                         'outbox_retry_due_unpaused', 'outbox_paused', 'outbox_paused_pending')
       AND NOT (i.indisvalid AND i.indisready);
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'index % is not valid (left by a CREATE INDEX CONCURRENTLY that failed?): drop it and migrate again', bad;
    END IF;
END $$;

DROP INDEX IF EXISTS outbox_pending_unkeyed;
DROP INDEX IF EXISTS outbox_scheduled_unkeyed;
DROP INDEX IF EXISTS outbox_retry_due;
ALTER INDEX outbox_pending_unkeyed_unpaused RENAME TO outbox_pending_unkeyed;
ALTER INDEX outbox_scheduled_unkeyed_unpaused RENAME TO outbox_scheduled_unkeyed;
ALTER INDEX outbox_retry_due_unpaused RENAME TO outbox_retry_due;

-- Rows written: flagged when their exchange is paused. SECURITY DEFINER: a
-- producer needs no right on outbox_pauses to write a message.
CREATE OR REPLACE FUNCTION outbox_paused_row() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM 1 FROM outbox_pauses p WHERE p.kind = 'exchange' AND p.name = NEW.exchange
        FOR KEY SHARE;
    NEW.paused := FOUND;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS outbox_paused_row ON outbox_messages;
CREATE TRIGGER outbox_paused_row BEFORE INSERT ON outbox_messages
    FOR EACH ROW EXECUTE FUNCTION outbox_paused_row();

-- The pauses already in force.
UPDATE outbox_messages m SET paused = true
  FROM outbox_pauses p
 WHERE p.kind = 'exchange' AND m.exchange = p.name
   AND m.status IN ('pending', 'publish_failed', 'dead') AND NOT m.paused;
