-- Reserved: migration 013 belongs to another change of this release. This placeholder keeps the
-- numbering contiguous until that change lands and replaces it; it does nothing.
SELECT 1;
