"""ansible-core's inventory API, imported when first needed: `tfcluster --help` does not pay for it."""


def ansible_api():
    """(AnsibleError, InventoryManager, DataLoader, Templar, VariableManager), with unparsed
    inventories failing rather than warning."""
    from ansible import constants
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager
    constants.INVENTORY_UNPARSED_IS_FAILED = True
    return AnsibleError, InventoryManager, DataLoader, Templar, VariableManager
