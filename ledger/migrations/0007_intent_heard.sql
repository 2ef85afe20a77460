-- Entity slots and budgets belong to a tool of one toolset: two servers' `refund` tools, or a
-- `refund` in two toolsets, do not share an order's slot or its refundable amount. A budget's
-- amounts also carry their currency, when the tool declares one: euros and dollars on one order are
-- two budgets, never summed. See ledger/guards.py.
--
-- Rows written before this migration have no toolset; the guards count them against every toolset's
-- tool of that name (the old key), so an unresolved call recorded before the upgrade still holds its
-- slot and its amount.
ALTER TABLE tool_executions
    ADD COLUMN toolset  text,
    ADD COLUMN currency text,
    ADD CONSTRAINT currency_needs_amount CHECK (currency IS NULL OR amount IS NOT NULL);

DROP INDEX tool_executions_one_unresolved_per_entity;
CREATE UNIQUE INDEX tool_executions_one_unresolved_per_entity
    ON tool_executions (tenant, coalesce(toolset, ''), tool_name, entity)
    WHERE entity_exclusive AND status IN ('awaiting_approval', 'started', 'indeterminate');
