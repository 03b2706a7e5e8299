from trainer.threads import wait_passively

wait_passively()  # before anything imports torch: its OpenMP runtime reads the policy once, when it loads

from trainer.finish import exit_now  # noqa: E402
from trainer.train import main  # noqa: E402

exit_now(main())  # not sys.exit: half a second of finalization after the work is done (trainer.finish)
