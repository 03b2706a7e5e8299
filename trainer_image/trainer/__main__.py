from trainer.threads import wait_passively

wait_passively()  # before anything imports torch: its OpenMP runtime reads the policy once, when it loads

import sys  # noqa: E402

from trainer import prefetch  # noqa: E402
from trainer.args import parse_args  # noqa: E402

prefetch.start(parse_args(sys.argv[1:]))  # a rank alone reads its rows while torch is imported

from trainer.finish import exit_now  # noqa: E402
from trainer.train import main  # noqa: E402

exit_now(main())  # not sys.exit: half a second of finalization after the work is done (trainer.finish)
