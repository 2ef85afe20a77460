-- Reserved: another branch of issue 18 adds its own 0007. This one changes nothing, so that 0008
-- applies on its own in the meantime; drop it when that 0007 is merged (migrate.py refuses two 0007s).
SELECT 1;
