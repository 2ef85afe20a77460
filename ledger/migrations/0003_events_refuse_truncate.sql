-- Events are evidence: TRUNCATE would erase them without touching a row trigger, so refuse it too.

CREATE TRIGGER tool_execution_events_no_truncate
    BEFORE TRUNCATE ON tool_execution_events
    FOR EACH STATEMENT EXECUTE FUNCTION tool_execution_events_append_only();
