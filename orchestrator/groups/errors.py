"""What a group raises when it can no longer step with its current members, or cannot form at all."""


class GroupBroken(RuntimeError):
    """A collective failed because a member is gone (its process or node died); the learner
    stops its chunk and the driver re-forms the group with the members that are left."""


class GroupCannotForm(RuntimeError):
    """Every member's join failed the same way, again, with no member gone: a cause that will
    repeat (an address nobody can reach, a wrong `group.interface`), so the job stops with this
    one line instead of replacing learners that are not at fault."""
