"""Issue 20 items 5, 7 and 10 on a real PostgreSQL: a run without validation never moves the head unless the author
allows it; a training run belongs to one DAG run, not to a run id; one run of a model trains at a time."""

from __future__ import annotations

from types import SimpleNamespace

import psycopg
import pytest

from pgtrain.config.params import TrainingConfig
from pgtrain.core.errors import SourceError, TrainingBusy
from pgtrain.runs.record import get_run, outcome, plan_run, record_epoch
from pgtrain.store.model_store import commit_run, head_version
from pgtrain.store.tensors import write_staged
from tests.db.test_model_store import MODEL, OWNER, SPEC, parameters, prepare_run
from tests.support import planned_run, seed_samples


def unvalidated_run(url: str, dag_run_id: str, **gate) -> str:
    """A trained run that recorded no validation metric (it had no validation rows)."""
    config = TrainingConfig(model_name=MODEL, hidden_sizes=SPEC.hidden_sizes, validation_fraction=0, **gate)
    with psycopg.connect(url, autocommit=True) as conn:
        run = plan_run(conn, "pgtrain_training", dag_run_id, config)
        conn.execute("UPDATE pgtrain.training_runs SET input_dim = %s, num_classes = %s, output_dim = %s, "
                     "status = 'trained' WHERE run_id = %s",
                     (SPEC.input_dim, SPEC.num_classes, SPEC.num_classes, run.run_id))
        write_staged(conn, run.run_id, parameters(1.0))
        record_epoch(conn, run.run_id, 1, {"train_loss": 1.0, "train_accuracy": 0.5, "seconds": 0.1})
    return run.run_id


# -- item 5 ---------------------------------------------------------------------------------------------------
def test_a_plan_without_validation_rows_is_refused_unless_the_author_allows_it(autocommit):
    autocommit.execute("CREATE TABLE public.one (id bigint PRIMARY KEY, features real[] NOT NULL, label int NOT NULL)")
    autocommit.execute("INSERT INTO public.one VALUES (1, '{1, 2}', 0)")

    with pytest.raises(SourceError, match=r"holds out none of the 1 usable rows of public\.one .*"
                                          r"quality_gate: \{allow_unvalidated: true\}"):
        planned_run(autocommit, "tiny", source_table="public.one", num_classes=2)
    assert planned_run(autocommit, "allowed", source_table="public.one", num_classes=2,
                       allow_unvalidated=True).input_dim == 2


def test_a_version_without_validation_metrics_is_not_made_the_head_unless_allowed(db_url, aconn):
    held = commit_run(aconn, unvalidated_run(db_url, "held"), owner=OWNER)
    assert (held.version, held.head_moved, head_version(aconn, MODEL)) == (1, False, None)
    note = outcome(aconn, "pgtrain_training/held")
    assert note.startswith(f"{MODEL} v1 committed, not made the head: committed as version 1 without moving the "
                           "head (version none): the run recorded no validation metric") and "allow_unvalidated" in note
    assert note.endswith("no validation metric; head stays none"), note

    allowed = commit_run(aconn, unvalidated_run(db_url, "allowed", allow_unvalidated=True), owner=OWNER)
    assert (allowed.version, allowed.head_moved, head_version(aconn, MODEL)) == (2, True, 2)


# -- item 7 ---------------------------------------------------------------------------------------------------
class StateStore:
    """What Airflow's task state store is to plan_run: kept by retries and clears, gone with its DAG run."""

    def __init__(self) -> None:
        self.values: dict[str, object] = {}

    def get(self, key: str, default: object = None) -> object:
        return self.values.get(key, default)

    def set(self, key: str, value: object, *, retention: object = None) -> None:
        self.values[key] = value


def test_a_dag_run_reusing_an_old_run_id_gets_a_run_of_its_own(autocommit, db_url, monkeypatch):
    from pgtrain.airflow.dag import tasks
    from pgtrain.airflow.dag.params import dag_params
    from pgtrain.config.settings import AuthorSettings
    from tests.k8s_sim.airflow_context import FakeTaskInstance

    monkeypatch.setenv("AIRFLOW_CONN_PGTRAIN_DB", db_url)
    seed_samples(autocommit, 40)
    params = {name: param.value for name, param in dag_params(fixed=["launcher"]).items()} | {"model_name": "bound"}

    def plan_run_task(store: StateStore, try_number: int = 1) -> str:
        ti = FakeTaskInstance(dag_id="pgtrain_training", task_id="plan_run", run_id="scheduled__1",
                              try_number=try_number)
        dag_run = SimpleNamespace(dag_id="pgtrain_training", run_id="scheduled__1", run_type="manual", conf={})
        return tasks.plan_run.function(AuthorSettings().to_dict(), {"launcher": "local"}, params=params,
                                       dag_run=dag_run, ti=ti, task_state_store=store)

    first_dag_run = StateStore()
    first = plan_run_task(first_dag_run)
    assert first == "pgtrain_training/scheduled__1"
    assert plan_run_task(first_dag_run, try_number=2) == first, "a retry or a clear keeps its run"
    autocommit.execute("UPDATE pgtrain.training_runs SET status = 'committed' WHERE run_id = %s", (first,))

    # The metadata database was reset: a new DAG run, same id, no state store entry.
    second = plan_run_task(StateStore())
    assert second == "pgtrain_training/scheduled__1#2"
    assert (get_run(autocommit, second).status, get_run(autocommit, first).status) == ("planned", "committed")

    # A try killed after binding its DAG run to a run but before creating the record: its retry creates that run.
    killed = StateStore()
    killed.set(tasks.RUN_BINDING, "pgtrain_training/scheduled__1#3")
    assert plan_run_task(killed, try_number=2) == "pgtrain_training/scheduled__1#3"
    # An id freed by hand is taken again, never an existing run handed to a new DAG run.
    autocommit.execute("DELETE FROM pgtrain.training_runs WHERE run_id = %s", (second,))
    assert plan_run_task(StateStore()) == second
    assert get_run(autocommit, first).status == "committed"


def test_the_note_of_a_committed_run_never_contradicts_itself(db_url, aconn):
    first = prepare_run(db_url, "first")
    commit_run(aconn, first, owner=OWNER)
    commit_run(aconn, prepare_run(db_url, "second"), owner=OWNER)

    assert outcome(aconn, first) == (f"{MODEL} v1 committed: val_accuracy 0.9000, val_loss 0.5500; "
                                     "head none -> v1 (since moved to v2)")
    late = prepare_run(db_url, "late", val_accuracy=0.1, max_accuracy_drop=0.0)
    aconn.execute("UPDATE pgtrain.training_runs SET base_version = 1 WHERE run_id = %s", (late,))
    with pytest.raises(Exception, match="quality gate"):
        commit_run(aconn, late, owner=OWNER)
    assert outcome(aconn, late).endswith("; head v1 -> v2 (moved by another run)")


# -- item 10 --------------------------------------------------------------------------------------------------
def test_a_second_run_of_a_model_is_refused_while_one_holds_its_training_claim(autocommit, db_url):
    from pgtrain.launch.attempt import claim_name, training_claim
    from pgtrain.store.catalog import list_locks

    seed_samples(autocommit, 40)
    one = planned_run(autocommit, "one", model_name="claimed")
    two = planned_run(autocommit, "two", model_name="claimed")
    other = planned_run(autocommit, "other", model_name="elsewhere")

    with training_claim(db_url, one, {"dag_id": "d", "task_id": "train"}):
        with pytest.raises(TrainingBusy, match=r"model 'claimed' is being trained by run pgtrain_test/one "
                                               r"\(dag_id=d, task_id=train, .*run pgtrain_test/two launches no"):
            with training_claim(db_url, two, wait=0):
                pytest.fail("a second run of the model got the claim")
        with training_claim(db_url, other, wait=0):  # another model trains meanwhile
            pass
        held = {lock["name"]: lock for lock in list_locks(autocommit)}[claim_name("claimed")]
        assert held["owner"]["training_run"] == one.run_id
    with training_claim(db_url, two, wait=0):  # released with the first one's block
        assert get_run(autocommit, two.run_id).attempt == 0
