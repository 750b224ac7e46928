-- Placeholder for migration 009, which another branch adds on main. It exists on this branch
-- only so the migration sequence has no gap; it is not merged.
SELECT 1;
