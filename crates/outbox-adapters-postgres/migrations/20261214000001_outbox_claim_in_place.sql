-- A claim rewrites a row only to set its lease (locked_by, locked_until). PostgreSQL
-- writes such an update in place, as a heap-only tuple (HOT: no new entry in any
-- index), when no index covers a changed column (key or predicate) and the row's
-- page has room for the new version. Neither held: outbox_leased indexed the lease
-- columns, and pages were filled to 90 %, with no room for a row of 1 KiB. So every
-- claim wrote a new entry for the row in every index whose predicate it met: the
-- primary key, id, outbox_pending, outbox_leased itself, the pick's own
-- (outbox_pending_unkeyed; outbox_scheduled and outbox_scheduled_unkeyed; or
-- outbox_ordered and outbox_ordered_live), and outbox_correlation when set: five to
-- seven. It left the old entries behind, dead, for the next claims' index scans (a
-- keyed claim's walk) to step over until vacuum.
--
-- outbox_leased served only the housekeeping that clears leases of vanished relays,
-- which now reads the front of each of the claims' picks instead (where claims take
-- rows from; a claim takes a row whose lease ran out whether it was cleared or not). A fill
-- factor of 45 leaves room on each page for a new version of every row it holds
-- (fewer than half the page, with the line pointers), so the claim of a whole page
-- stays on it. The cost: pages of new rows are filled less than half, so a backlog
-- of unsent rows takes about twice the pages it did (sent rows less: the mark's new
-- version lands on the same page, where the claim's old one is pruned). It applies
-- to pages written from now on; existing rows are not rewritten. An operator who
-- prefers the smaller table can set the fill factor back (ALTER TABLE ... SET
-- (fillfactor = 90)); claims then rewrite the index entries again, and nothing else
-- changes.

SET LOCAL lock_timeout = '5s';

DROP INDEX IF EXISTS outbox_leased;
ALTER TABLE outbox_messages SET (fillfactor = 45);
