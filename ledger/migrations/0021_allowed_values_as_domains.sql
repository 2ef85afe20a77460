-- Three lists of allowed values, and the SHA-256 rule, as domains instead of table CHECKs.
--
-- PostgreSQL keeps a table's CHECK constraints as node text and reads each one back, and prepares
-- it, in every statement that writes the table; and it runs all of them on every update, whichever
-- columns change. Measured in instructions (docs/benchmarks.md, "Issue 22, eighth pass"), the
-- CHECKs were about half of each ledger write, and the longest of them were the lists of allowed
-- values (their arrays are printed byte by byte in the node text) and the hash rule. A domain's
-- CHECK is read and prepared once per connection, and an update checks it only for the columns it
-- sets. The rules are the same, word for word; a value that breaks one is refused with the same
-- SQLSTATE (23514, check_violation), now naming the domain's constraint.
--
-- `status` keeps its table CHECK: onceflow_guarded_decide (0017) hands a row's status back through
-- RETURN QUERY as a text column, which must then be text exactly, and four partial indexes name
-- it. Moving it too means restating that function; it is left for a change of its own.
--
-- The columns move without rewriting or reading anything, so writes wait only an instant: a column
-- changed to a domain that already has a CHECK would be rewritten with all its indexes, so each
-- domain is made bare, the tables' old CHECKs go, the columns move to the domains (the same text
-- underneath; no index names these columns in a predicate or an expression, so none is built
-- again), then each domain gets its CHECK as NOT VALID (PostgreSQL checks every value written from
-- now on, but does not read the rows already there). The rows already there need no reading: until
-- this transaction the old CHECKs held every one of them to the same rule, and no write comes
-- between them and the new ones. On a ledger of a million calls with two events each this migration
-- took 0.01 s; validating would read each table once per domain while writes wait, 3.5 s
-- (docs/benchmarks.md, "Issue 22, ninth pass"). docs/operations.md says how to mark the constraints
-- validated later, if wanted: it changes nothing else.

CREATE DOMAIN onceflow_side_effect AS text;
CREATE DOMAIN onceflow_failure_kind AS text;
CREATE DOMAIN onceflow_event_source AS text;
CREATE DOMAIN onceflow_sha256 AS text;

-- The tables' old CHECKs go first: a CHECK on a column whose type changes is added again after
-- it, and checked against every row. Nothing is written meanwhile: each table stays locked from
-- here to the end of this transaction.
ALTER TABLE tool_executions
    DROP CONSTRAINT tool_executions_side_effect_check,
    DROP CONSTRAINT tool_executions_failure_kind_check,
    DROP CONSTRAINT payload_sha256_is_hex;
ALTER TABLE tool_execution_events DROP CONSTRAINT tool_execution_events_source_check;
ALTER TABLE conversation_messages DROP CONSTRAINT sha256_is_hex;
ALTER TABLE operator_tokens DROP CONSTRAINT token_sha256_is_hex;

ALTER TABLE tool_executions
    ALTER COLUMN side_effect TYPE onceflow_side_effect,
    ALTER COLUMN failure_kind TYPE onceflow_failure_kind,
    ALTER COLUMN payload_sha256 TYPE onceflow_sha256;
ALTER TABLE tool_execution_events ALTER COLUMN source TYPE onceflow_event_source;
ALTER TABLE conversation_messages ALTER COLUMN sha256 TYPE onceflow_sha256;
ALTER TABLE operator_tokens ALTER COLUMN token_sha256 TYPE onceflow_sha256;

-- The same lists as the CHECKs they replace (as migrations 0001, 0005, 0006 and 0008 left them),
-- which ledger/status.py's enums mirror (tests/test_ledger_migrate.py holds them to each other).
ALTER DOMAIN onceflow_side_effect ADD CONSTRAINT onceflow_side_effect_known
    CHECK (VALUE IN ('read', 'write', 'external', 'destructive')) NOT VALID;
ALTER DOMAIN onceflow_failure_kind ADD CONSTRAINT onceflow_failure_kind_known
    CHECK (VALUE IN ('not_attempted', 'rejected', 'not_applied', 'denied', 'policy_refused',
                     'guard_refused', 'released')) NOT VALID;
ALTER DOMAIN onceflow_event_source ADD CONSTRAINT onceflow_event_source_known
    CHECK (VALUE IN ('owner', 'inspector', 'signal', 'update', 'api', 'reconciler', 'deadline',
                     'compensation', 'guard', 'unrecorded')) NOT VALID;
-- 0020's rule: 64 characters, none left once the lower-case hex digits are trimmed.
ALTER DOMAIN onceflow_sha256 ADD CONSTRAINT onceflow_sha256_is_hex
    CHECK (length(VALUE) = 64 AND ltrim(VALUE, '0123456789abcdef') = '') NOT VALID;
