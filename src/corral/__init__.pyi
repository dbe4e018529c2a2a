# Generated from the list of public names in __init__.py (corral._facade.stub):
# do not edit; `python tests/project/test_facade.py` writes it again.

from ._core._options import StartOptions as StartOptions
from ._core._process import Process as Process
from ._core._stdio import DEVNULL as DEVNULL
from ._core._stdio import LOG as LOG
from ._core._stdio import PIPE as PIPE
from ._core._stdio import STDOUT as STDOUT
from ._core._token import LoopToken as LoopToken
from ._errors import STDERR_TAIL_BYTES as STDERR_TAIL_BYTES
from ._errors import CorralError as CorralError
from ._errors import HandshakeError as HandshakeError
from ._errors import LaunchError as LaunchError
from ._errors import ProcessFailed as ProcessFailed
from ._errors import RemoteTraceback as RemoteTraceback
from ._errors import ResourceLimitError as ResourceLimitError
from ._errors import Signalled as Signalled
from ._errors import StartupFailed as StartupFailed
from ._errors import WorkerFailed as WorkerFailed
from ._errors import WrongLoopError as WrongLoopError
from ._launch._hosts import DEFAULT_ENV_PATTERNS as DEFAULT_ENV_PATTERNS
from ._launch._hosts import HOST_ENV_NAMES as HOST_ENV_NAMES
from ._logs._console import ConsoleHandler as ConsoleHandler
from ._logs._route import Route as Route
from ._logs._sources import LogTail as LogTail
from ._results import CompletedProcess as CompletedProcess
from ._results import LaunchResult as LaunchResult
from ._runner._options import RunnerLaunchOptions as RunnerLaunchOptions
from ._runner._options import RunnerOptions as RunnerOptions
from ._runner._runner import Runner as Runner
from ._runner._runner import open_runner as open_runner
from ._scaleout import SSH as SSH
from ._scaleout import LaunchOptions as LaunchOptions
from ._sync._handles import SyncLogTail as SyncLogTail
from ._sync._handles import SyncProcess as SyncProcess
from ._sync._runner import SyncRunner as SyncRunner
from ._sync._runner import launch as launch
from ._sync._runner import open_runner_sync as open_runner_sync
from ._sys._proc import ResourceUsage as ResourceUsage

__version__: str
