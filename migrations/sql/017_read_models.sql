-- Reserved: replaced by the read models change.
SELECT 1;
