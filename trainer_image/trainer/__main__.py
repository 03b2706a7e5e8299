import sys

from trainer.threads import wait_passively

wait_passively()  # before anything imports torch: its OpenMP runtime reads the policy once, when it loads

from trainer.train import main  # noqa: E402

sys.exit(main())
