-- The SHA-256 columns are checked without a regular expression.
--
-- `payload_sha256 ~ '^[0-9a-f]{64}$'` ran PostgreSQL's regex engine on every write of a call: the
-- bounded repeat makes it step through 64 states per character, about 88 k instructions each time,
-- and a CHECK runs on the update of any column, so a reserve + complete cycle paid it twice (about
-- 8% of the cycle's 2.0 M; docs/benchmarks.md, "Issue 22, eighth pass"). The same rule is said here
-- with two plain string functions: 64 characters, and none left once the hex digits are trimmed
-- away. conversation_messages (a row per message a run stores) and operator tokens get the same.
--
-- Each table's new check is added, which reads its rows once while writes to it wait (about 4 s
-- for a million calls of 700 bytes here; adding the regex took 14 s), before the old one goes, in
-- this one transaction.

ALTER TABLE tool_executions
    ADD CONSTRAINT payload_sha256_is_hex
    CHECK (length(payload_sha256) = 64 AND ltrim(payload_sha256, '0123456789abcdef') = ''),
    DROP CONSTRAINT tool_executions_payload_sha256_check;

ALTER TABLE conversation_messages
    ADD CONSTRAINT sha256_is_hex
    CHECK (length(sha256) = 64 AND ltrim(sha256, '0123456789abcdef') = ''),
    DROP CONSTRAINT conversation_messages_sha256_check;

ALTER TABLE operator_tokens
    ADD CONSTRAINT token_sha256_is_hex
    CHECK (length(token_sha256) = 64 AND ltrim(token_sha256, '0123456789abcdef') = ''),
    DROP CONSTRAINT operator_tokens_token_sha256_check;
