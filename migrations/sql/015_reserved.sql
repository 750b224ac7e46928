-- Intentionally empty. This number was held for a change that landed under a later number;
-- databases have recorded it as applied, so it stays, and does nothing.
SELECT 1;
