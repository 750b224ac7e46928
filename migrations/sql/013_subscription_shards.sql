-- Sharded subscriptions (events.ShardedSubscription, docs/architecture.md "Sharded
-- subscriptions"): a subscription split into buckets by stream, each bucket leased by one worker
-- at a time and carrying its own checkpoint. Idempotent: every statement can run twice.

-- One row per (subscription, bucket). owner_worker_id and lease_expires_at are both set while a
-- worker holds the bucket and both NULL once it is released; an expired lease may be taken by
-- any worker. checkpoint is the last global position whose effects in this bucket are
-- committed; it is written only by the owner of an unexpired lease, in the handler's
-- transaction. shard_count is the number of buckets the subscription was created with: every
-- worker must agree on it (a worker configured with another count refuses to start).
CREATE TABLE IF NOT EXISTS {{.schema}}.keiro_subscription_shards (
    subscription_name text        NOT NULL,
    bucket            integer     NOT NULL,
    shard_count       integer     NOT NULL CHECK (shard_count >= 1),
    owner_worker_id   uuid,
    lease_expires_at  timestamptz,
    heartbeat_at      timestamptz,
    checkpoint        bigint      NOT NULL DEFAULT 0 CHECK (checkpoint >= 0),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subscription_name, bucket),
    CONSTRAINT keiro_subscription_shards_bucket_check CHECK (bucket >= 0 AND bucket < shard_count),
    CONSTRAINT keiro_subscription_shards_owner_check CHECK ((owner_worker_id IS NULL) = (lease_expires_at IS NULL))
);

-- The workers of a sharded subscription that are alive: each renews its row with its leases and
-- deletes it when it stops. The live members (unexpired rows) decide every worker's fair share,
-- so a worker that owns nothing yet (it just joined) still counts.
CREATE TABLE IF NOT EXISTS {{.schema}}.keiro_subscription_shard_members (
    subscription_name text        NOT NULL,
    worker_id         uuid        NOT NULL,
    lease_expires_at  timestamptz NOT NULL,
    joined_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subscription_name, worker_id)
);
