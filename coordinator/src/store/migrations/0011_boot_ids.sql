-- The boot id each machine's agent last reported, kept across coordinator restarts: a power
-- step that starts before the agent has reconnected to a restarted coordinator still knows
-- the boot before it, so `@agent-healthy` can insist on a new one. NULL: never reported.
ALTER TABLE machines ADD COLUMN boot_id TEXT;
