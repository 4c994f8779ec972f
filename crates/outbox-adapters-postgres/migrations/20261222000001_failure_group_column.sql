-- Failure groups exact at any number of rows (issue 49): each row keeps the
-- group of its last error (outbox_core::failure_group: ids, numbers and quoted
-- values taken out) in error_group, so the console counts groups with one
-- GROUP BY and lists a group's members with one index, instead of reading the
-- 10,000 most frequent texts and grouping those (which dropped whole causes
-- whose texts all differ).
--
-- The library writes error_group beside last_error, computed in Rust. A row
-- whose last_error is written without it (plain SQL, an older build) gets it
-- from outbox_failure_group, the same function in PL/pgSQL (ASCII classes only,
-- so the database's locale changes nothing; the adapter's tests hold it equal
-- to the Rust one), by the triggers below. This migration holds the tables'
-- locks only for adding a nullable column and the triggers; the rows that
-- failed before it are grouped by 20261222000002 in batches, each committed
-- (no long lock), and indexed by 20261222000003.
SET LOCAL lock_timeout = '5s';

ALTER TABLE outbox_messages ADD COLUMN IF NOT EXISTS error_group text;
ALTER TABLE outbox_inbox ADD COLUMN IF NOT EXISTS error_group text;

-- outbox_core::failure_group::failure_group step for step (its comments say
-- why); characters as code points, so no comparison depends on a collation.
CREATE OR REPLACE FUNCTION outbox_failure_group(error text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    chars text[] := regexp_split_to_array(left(error, 4096), '');
    cp integer[];
    n integer := coalesce(array_length(chars, 1), 0);
    parts text[] := '{}';
    k integer := 0;
    i integer := 1;
    j integer;
    e integer;
    c integer;
    x integer;
    word boolean := false;   -- the output ends in a letter, digit or '_'
    spaced boolean := true;  -- the output is empty or ends in a space
    digit boolean;
    alpha boolean;
    uuid boolean;
BEGIN
    cp := ARRAY(SELECT ascii(ch) FROM unnest(chars) AS ch);
    WHILE i <= n LOOP
        c := cp[i];
        IF (c = 34 OR c = 39) AND NOT word THEN
            j := i + 1;
            WHILE j <= n AND cp[j] <> c LOOP j := j + 1; END LOOP;
            k := k + 1; parts[k] := chars[i] || '…' || chars[i];
            word := false; spaced := false;
            i := j + 1;
            CONTINUE;
        END IF;
        IF c IN (32, 9, 10, 13, 12) THEN
            IF NOT spaced THEN k := k + 1; parts[k] := ' '; spaced := true; word := false; END IF;
            i := i + 1;
            CONTINUE;
        END IF;
        IF NOT word AND ((c BETWEEN 48 AND 57) OR (c BETWEEN 65 AND 70) OR (c BETWEEN 97 AND 102)) THEN
            e := NULL;
            IF i + 35 <= n THEN
                uuid := true;
                FOR j IN 0..35 LOOP
                    x := cp[i + j];
                    IF j IN (8, 13, 18, 23) THEN
                        IF x <> 45 THEN uuid := false; EXIT; END IF;
                    ELSIF NOT ((x BETWEEN 48 AND 57) OR (x BETWEEN 65 AND 70) OR (x BETWEEN 97 AND 102)) THEN
                        uuid := false; EXIT;
                    END IF;
                END LOOP;
                x := coalesce(cp[i + 36], 0);
                IF uuid AND NOT ((x BETWEEN 48 AND 57) OR (x BETWEEN 65 AND 90) OR (x BETWEEN 97 AND 122) OR x = 95) THEN
                    k := k + 1; parts[k] := '<id>';
                    word := false; spaced := false; i := i + 36;
                    CONTINUE;
                END IF;
            END IF;
            IF c = 48 AND coalesce(cp[i + 1], 0) = 120 THEN
                j := i + 2;
                WHILE j <= n AND j < i + 66 LOOP
                    x := cp[j];
                    EXIT WHEN NOT ((x BETWEEN 48 AND 57) OR (x BETWEEN 65 AND 70) OR (x BETWEEN 97 AND 102));
                    j := j + 1;
                END LOOP;
                x := coalesce(cp[j], 0);
                IF j > i + 2 AND NOT ((x BETWEEN 48 AND 57) OR (x BETWEEN 65 AND 90) OR (x BETWEEN 97 AND 122) OR x = 95) THEN
                    e := j;
                END IF;
            END IF;
            IF e IS NULL THEN
                j := i; digit := false; alpha := false;
                WHILE j <= n AND j < i + 64 LOOP
                    x := cp[j];
                    IF x BETWEEN 48 AND 57 THEN digit := true;
                    ELSIF (x BETWEEN 65 AND 70) OR (x BETWEEN 97 AND 102) THEN alpha := true;
                    ELSE EXIT;
                    END IF;
                    j := j + 1;
                END LOOP;
                x := coalesce(cp[j], 0);
                IF j - i >= 8 AND digit AND alpha
                   AND NOT ((x BETWEEN 48 AND 57) OR (x BETWEEN 65 AND 90) OR (x BETWEEN 97 AND 122) OR x = 95) THEN
                    e := j;
                END IF;
            END IF;
            IF e IS NOT NULL THEN
                k := k + 1; parts[k] := '<hex>';
                word := false; spaced := false; i := e;
                CONTINUE;
            END IF;
        END IF;
        IF NOT word AND c BETWEEN 48 AND 57 THEN
            WHILE i <= n AND cp[i] BETWEEN 48 AND 57 LOOP i := i + 1; END LOOP;
            k := k + 1; parts[k] := '<n>';
            word := false; spaced := false;
            CONTINUE;
        END IF;
        k := k + 1; parts[k] := chars[i];
        word := (c BETWEEN 48 AND 57) OR (c BETWEEN 65 AND 90) OR (c BETWEEN 97 AND 122) OR c = 95;
        spaced := false;
        i := i + 1;
    END LOOP;
    RETURN rtrim(array_to_string(parts, ''), ' ');
END
$fn$;

-- The trigger's function finds outbox_failure_group in this schema whatever the
-- writer's search_path.
CREATE OR REPLACE FUNCTION outbox_error_group_of_row() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
BEGIN
    NEW.error_group := outbox_failure_group(NEW.last_error);
    RETURN NEW;
END
$fn$;

-- Fired only where a writer changed last_error and left error_group as it was
-- (the WHEN is evaluated without calling the function): the library's own
-- writes set both and pay nothing but when the group stays the same (then the
-- function runs again: about 0.15 ms for an error of a few hundred characters,
-- a few ms for one of 4 KB).
DROP TRIGGER IF EXISTS outbox_error_group_on_insert ON outbox_messages;
CREATE TRIGGER outbox_error_group_on_insert BEFORE INSERT ON outbox_messages
    FOR EACH ROW WHEN (NEW.last_error IS NOT NULL AND NEW.error_group IS NULL)
    EXECUTE FUNCTION outbox_error_group_of_row();
DROP TRIGGER IF EXISTS outbox_error_group_on_update ON outbox_messages;
CREATE TRIGGER outbox_error_group_on_update BEFORE UPDATE OF last_error ON outbox_messages
    FOR EACH ROW WHEN (NEW.last_error IS DISTINCT FROM OLD.last_error
                       AND NEW.error_group IS NOT DISTINCT FROM OLD.error_group)
    EXECUTE FUNCTION outbox_error_group_of_row();
DROP TRIGGER IF EXISTS inbox_error_group_on_insert ON outbox_inbox;
CREATE TRIGGER inbox_error_group_on_insert BEFORE INSERT ON outbox_inbox
    FOR EACH ROW WHEN (NEW.last_error IS NOT NULL AND NEW.error_group IS NULL)
    EXECUTE FUNCTION outbox_error_group_of_row();
DROP TRIGGER IF EXISTS inbox_error_group_on_update ON outbox_inbox;
CREATE TRIGGER inbox_error_group_on_update BEFORE UPDATE OF last_error ON outbox_inbox
    FOR EACH ROW WHEN (NEW.last_error IS DISTINCT FROM OLD.last_error
                       AND NEW.error_group IS NOT DISTINCT FROM OLD.error_group)
    EXECUTE FUNCTION outbox_error_group_of_row();
