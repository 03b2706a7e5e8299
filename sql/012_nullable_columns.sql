-- The scalar feature columns that are NULL in some row a plan checked (statistics.nullable_columns). The loader
-- replaces NULLs (a column's imputed mean, a category's NULL hash) in those columns only: the rows it reads are
-- the planned ones, unchanged, so a coalesce per value of the other columns would never fire. NULL: planned
-- before this column existed, every column may be NULL.
ALTER TABLE pgtrain.shard_plans ADD COLUMN IF NOT EXISTS nullable_columns text[];
COMMENT ON COLUMN pgtrain.shard_plans.nullable_columns IS
    'feature columns NULL in some checked row; the loader replaces NULLs in these only (NULL: in every column)';
