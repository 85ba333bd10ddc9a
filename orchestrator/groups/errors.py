"""What a group raises when it can no longer step with its current members."""


class GroupBroken(RuntimeError):
    """A collective failed because a member is gone (its process or node died); the learner
    stops its chunk and the driver re-forms the group with the members that are left."""
