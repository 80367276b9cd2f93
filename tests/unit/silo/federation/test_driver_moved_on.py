"""What a silo says when the coordinator closed the attempt before its call arrived."""

from __future__ import annotations

import pytest

from trellis.protos.messages import Envelope, Instruction, Phase
from trellis.silo.federation.driver import SiloDriver
from trellis.silo.federation.link import RoundMovedOn
from trellis.silo.federation.session import SiloStage

REFUSAL = ("round 3 attempt 1 phase REVEAL_SHARES does not match the coordinator's round 4 "
           "attempt 1 stage advertise")


class _Session:
    """Only what SiloDriver.handle touches when a call is refused as out of date."""

    def __init__(self, stage: SiloStage) -> None:
        self.stage = stage
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


@pytest.mark.parametrize(("stage", "said"), [
    # The slowest silo's share reveal, not needed for unmasking: its input counted.
    (SiloStage.SIGNED, "round 3 attempt 1 closed before this silo's last step"),
    (SiloStage.SIGNED, "its masked input was among the survivors', so the round counts it"),
    # The reveal itself refused (a coordinator that lost the attempt, e.g. restarted): the
    # session marks the shares revealed before the call, and its input counted all the same.
    # Before, this said the round "went on without this silo".
    (SiloStage.REVEALED, "round 3 attempt 1 closed before this silo's last step"),
    # The upload itself may have been refused (SUBMITTED is set before it goes out), or the
    # silo was left out earlier: it cannot claim its input counted.
    (SiloStage.SUBMITTED, "round 3 attempt 1 went on without this silo"),
    (SiloStage.SHARED, "round 3 attempt 1 went on without this silo"),
    (SiloStage.TRAINED, "it takes part again from the next attempt")])
def test_the_log_line_says_whether_the_silos_input_was_in(
        monkeypatch: pytest.MonkeyPatch, stage: SiloStage, said: str) -> None:
    lines: list[str] = []
    session = _Session(stage)
    driver = SiloDriver(session, link=None, log=lines.append)  # type: ignore[arg-type]

    def refused(ins: Instruction) -> bool:
        raise RoundMovedOn(REFUSAL)

    monkeypatch.setattr(driver, "_handle", refused)
    unmask = Instruction(Envelope("fed", 3, 1, Phase.UNMASK), ("a", "b", "c"))
    assert driver.handle(unmask) is False
    assert len(lines) == 1 and said in lines[0] and REFUSAL in lines[0]
    assert session.aborted
