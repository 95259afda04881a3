-- The store's fencing epoch (owned by the store itself, next to its identity).
--
-- Bumped by one, durably, at every start of a coordinator on this store, and sent with every
-- power request and agent action as (store identity, epoch): a gateway or an agent that has
-- seen a higher epoch of the same identity refuses the request, so a coordinator that was
-- replaced (a second one started on a copy of the file, an old process that woke up) cannot
-- act. It only grows for one identity; a restore makes a new identity, whose epochs start
-- afresh wherever the backup's counter was.
ALTER TABLE store_identity ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
