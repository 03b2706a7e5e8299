-- Which collectives trained the run (trainer.collectives: horovod or torch), as its rank 0 started them: the
-- author's backend setting resolved (auto: horovod where horovod.torch imports, else torch). The version's spec
-- repeats it. NULL: trained before this column existed (Horovod, the only backend then).
ALTER TABLE pgtrain.training_runs ADD COLUMN IF NOT EXISTS backend text;
COMMENT ON COLUMN pgtrain.training_runs.backend IS
    'the collectives backend its ranks trained with (horovod, torch); NULL: before backends were recorded';
