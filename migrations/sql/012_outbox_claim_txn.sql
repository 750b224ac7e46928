-- Exactly-once claim relays (RelayConfig.ExactlyOnce, docs/architecture.md "Exactly-once
-- publication"): claim_txn is the Kafka transactional id of the relay whose claim holds the row
-- (set by the claim of an exactly-once relay, NULL otherwise). When such a claim is lost (its
-- relay died or froze past its lease), the rows' records may already be committed on Kafka: an
-- exactly-once relay does not re-claim them but fences that transactional id and reads the
-- claims its last transaction recorded, to mark sent what committed and release the rest.
-- No index: the claim sets it, and an indexed column would make every claim a non-HOT update;
-- the recovery's probe walks the open rows through the claim index. Nullable and without a
-- default: adding it rewrites nothing. Idempotent.
ALTER TABLE {{.schema}}.keiro_outbox ADD COLUMN IF NOT EXISTS claim_txn text;
