"""bcg.studies: the measurements behind the documentation: the contact gradient's variance and bias
(``contact_gradient``), the settling depth against MuJoCo (``penetration``) and the scatter of the
policy gradient over nearby windows (``gradscatter``). Nothing imports them."""
